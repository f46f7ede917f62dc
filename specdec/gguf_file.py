"""Reading a GGUF file's metadata: shared by the tokenizer (tokenizer.py) and the model loader (models/), so
the tokenizer needs nothing from models/."""
from __future__ import annotations

import os

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


# GGUF value types: fixed-size scalars by struct code; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def header_field(path, key, default=None):
    """One scalar or string of a GGUF file's metadata, read by walking the header and skipping what comes before
    it: a fraction of a second where `open_gguf` parses every tensor and token (over ten seconds for a 150k-token
    vocabulary on a slow core)."""
    import struct

    def num(f, code):
        size = struct.calcsize("<" + code)
        return struct.unpack("<" + code, f.read(size))[0]

    def length(f, unit=1):      # a count that would run past the end is a damaged or foreign file
        n = num(f, "Q")
        if f.tell() + n * unit > size:
            raise ValueError("a length runs past the end of the file")
        return n

    def string(f):
        return f.read(length(f)).decode("utf-8", errors="replace")

    def skip(f, vtype):
        if vtype in _SCALARS:
            f.seek(struct.calcsize("<" + _SCALARS[vtype]), 1)
        elif vtype == _STRING:
            f.seek(length(f), 1)
        elif vtype == _ARRAY:
            item = num(f, "I")
            if item in _SCALARS:
                unit = struct.calcsize("<" + _SCALARS[item])
                f.seek(length(f, unit) * unit, 1)
            else:
                for _ in range(length(f)):
                    skip(f, item)
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("not a GGUF file")
            num(f, "I")                                            # version
            num(f, "Q")                                            # tensors
            for _ in range(num(f, "Q")):                           # key/value pairs
                name, vtype = string(f), num(f, "I")
                if name != key:
                    skip(f, vtype)
                elif vtype in _SCALARS:
                    return num(f, _SCALARS[vtype])
                elif vtype == _STRING:
                    return string(f)
                else:
                    raise ValueError(f"{key} is not a scalar or a string")
    except (OSError, ValueError, OverflowError, struct.error) as exc:
        raise SpecDecError(f"cannot read GGUF file {path}: {exc}") from None
    return default
