"""Where tiny models convert to while fixtures load them (imported by conftest and the test modules)."""
from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def private_cache(tmp_path_factory):
    """SPECDEC_CACHE pointed at the session's private cache for the block, then put back as it was: for wider-
    scoped fixtures that load tiny models (the function-scoped _isolated_cache has not run for them yet). Left set,
    it would send the real-model tests' conversions to a temporary directory, paid again on every run."""
    old = os.environ.get("SPECDEC_CACHE")
    os.environ["SPECDEC_CACHE"] = str(tmp_path_factory.getbasetemp() / "specdec-cache")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SPECDEC_CACHE")
        else:
            os.environ["SPECDEC_CACHE"] = old


@contextlib.contextmanager
def gguf_read_once():
    """transformers reads a GGUF's metadata anew for its config, its tokenizer and its weights (gguf.GGUFReader parses
    every vocabulary entry in Python: ~8 s a read for Qwen's 151,936 tokens), so a reference computed from one file
    reads it three or four times. Inside the block each file is read once and the reader handed out again (it is a
    read-only memory map); transformers' own reading of the file is unchanged."""
    import gguf

    cls, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = cls(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = cls
