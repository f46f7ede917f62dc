"""Small shared helpers."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write JSON to a temporary file beside `path`, then rename it into place (never half-written)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
