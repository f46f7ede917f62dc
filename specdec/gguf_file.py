"""Reading a GGUF file's metadata: shared by the tokenizer (tokenizer.py) and the model loader (models/), so
the tokenizer needs nothing from models/."""
from __future__ import annotations

from .errors import SpecDecError


def open_gguf(path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises many kinds on a truncated or foreign file
        raise SpecDecError(f"cannot read GGUF file {path}: {exc.__class__.__name__}: {exc}") from None


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()
