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
