"""Small shared helpers."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .errors import SpecDecError


def parse_json_object(text: str, flag: str) -> dict:
    """A command-line flag's JSON object, or a one-line SpecDecError naming the flag."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecDecError(f"{flag} is not valid JSON ({exc.msg}): {text}") from None
    if not isinstance(obj, dict):
        raise SpecDecError(f"{flag} must be a JSON object")
    return obj


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text to a temporary file beside `path`, then rename it into place (never half-written)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def progress_bar(iterable, desc: str, enabled: bool = True):
    """tqdm over `iterable` on stderr when enabled (and tqdm is installed), else the iterable itself."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, dynamic_ncols=True)
