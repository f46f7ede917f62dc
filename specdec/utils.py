"""Small shared helpers."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from collections.abc import Iterator
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


@functools.cache
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside `path` to write the file at; renamed onto `path` when the block exits normally,
    removed when it raises, so `path` is never seen half-written. The one atomic-write primitive: the writers
    below, plots, training checkpoints and model assembly use it.

    >>> with atomic_path("out/plot.png") as tmp:  # doctest: +SKIP
    ...     fig.savefig(tmp, format="png")
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())      # what open() would give, not mkstemp's 0600
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def save_torch_atomic(obj, path: str | Path) -> None:
    """torch.save(obj, path), atomically."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def progress_bar(iterable, desc: str, enabled: bool = True):
    """tqdm over `iterable` on stderr when enabled (and tqdm is installed), else the iterable itself."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, dynamic_ncols=True)
