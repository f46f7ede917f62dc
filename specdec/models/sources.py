"""A model source's identity, for the converted-weights cache: a quick key from names, sizes and times; the sha256
of its bytes, recorded in each cache entry beside the stat it was last checked at, so weights are never read for a
source whose bytes changed and an unchanged source is not hashed at every start."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..utils import write_json_atomic


def source_key(path: Path) -> str:
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _source_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())


def _source_stat(path: Path) -> list:
    """What changes whenever a source file's bytes may have: size, times (ctime too: a copy that preserves the
    modification time, or a write through another name, still sets it) and inode."""
    return [[f.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] for f in _source_files(path)
            for st in [f.stat()]]


def source_digest(path: Path) -> str:
    """sha256 over the source's files, names and bytes (~1.5 s a GB)."""
    h = hashlib.sha256()
    for f in _source_files(path):
        h.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


SOURCE_RECORD = "source.json"      # in a cache entry: the source's checksum, and the stat it was last verified at


def record_source(entry: Path, source: Path, digest: str) -> None:
    write_json_atomic(entry / SOURCE_RECORD, {"sha256": digest, "stat": _source_stat(source)})


def made_from(entry: Path, source: Path) -> bool:
    """Whether the entry was converted from the bytes `source` holds now. While the source's stat is the one
    recorded, the record is trusted (ccache's direct mode: no hashing at start); otherwise the source is hashed
    again and compared. An entry from before records were kept is hashed once and trusted, as it always was."""
    try:
        record = json.loads((entry / SOURCE_RECORD).read_text())
        digest, stat = record["sha256"], record["stat"]
    except (OSError, ValueError, KeyError, TypeError):
        digest = stat = None
    if stat is not None and stat == _source_stat(source):
        return True
    now = source_digest(source)
    if digest is not None and digest != now:
        return False
    record_source(entry, source, now)
    return True
