"""Reading a GGUF file: its metadata and tensors, shared by the tokenizer (tokenizer.py) and the model loader
(models/), so the tokenizer needs nothing from models/.

The file is read by walking its header once: numeric arrays straight into numpy, string arrays a string at a time,
tensors as views into one memory map. The gguf package's reader makes a numpy view of every piece of every value (two
per token string): 12-19 s for a 150k-260k-token vocabulary on a slow core, against under a second here. Tensors
come out as the gguf package's do (`name`, `shape` innermost first, `tensor_type`, `data` in its layout), so
`gguf.quants` dequantizes them.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from .errors import SpecDecError

# GGUF value types: fixed-size scalars by struct code; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
          10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


@dataclass
class GGUFField:
    value: object

    @property
    def data(self) -> list:
        return self.value if isinstance(self.value, list) else [self.value]

    def contents(self):
        return self.value


@dataclass
class GGUFTensor:
    name: str
    shape: np.ndarray            # dims, innermost first (GGUF's order)
    tensor_type: object          # gguf.GGMLQuantizationType
    data: np.ndarray             # float types as floats, block-quantized ones as their bytes [rows..., row bytes]


class _Header:
    """A cursor over the file's bytes that refuses a length running past the end (a damaged or foreign file)."""

    def __init__(self, f, size: int):
        self.f, self.size = f, size

    def num(self, code: str):
        n = struct.calcsize("<" + code)
        raw = self.f.read(n)
        if len(raw) != n:
            raise ValueError("the file ends inside its header")
        return struct.unpack("<" + code, raw)[0]

    def length(self, unit: int = 1) -> int:
        n = self.num("Q")
        if self.f.tell() + n * unit > self.size:
            raise ValueError("a length runs past the end of the file")
        return n

    def string(self) -> str:
        return self.f.read(self.length()).decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool = True):
        """The next value (None when not kept: skipped cheaply)."""
        if vtype in _SCALARS:
            v = self.num(_SCALARS[vtype])
            return v if keep else None
        if vtype == _STRING:
            if not keep:
                self.f.seek(self.length(), 1)
                return None
            return self.string()
        if vtype == _ARRAY:
            item = self.num("I")
            if item in _SCALARS:
                unit = struct.calcsize("<" + _SCALARS[item])
                n = self.length(unit)
                if not keep:
                    self.f.seek(n * unit, 1)
                    return None
                return np.frombuffer(self.f.read(n * unit), dtype=np.dtype(_NUMPY[item]).newbyteorder("<")).tolist()
            n = self.length()
            out = [self.value(item, keep) for _ in range(n)]
            return out if keep else None
        raise ValueError(f"unknown GGUF value type {vtype}")


class GGUFFile:
    """A GGUF file's metadata (`fields`, key -> GGUFField) and tensors (`tensors`, views into a memory map)."""

    def __init__(self, path, stop_at: str | None = None):
        self.fields: dict[str, GGUFField] = {}
        self.tensors: list[GGUFTensor] = []
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            h = _Header(f, size)
            if f.read(4) != b"GGUF":
                raise ValueError("not a GGUF file")
            h.num("I")                                             # version
            n_tensors, n_kv = h.num("Q"), h.num("Q")
            for _ in range(n_kv):
                key, vtype = h.string(), h.num("I")
                if stop_at is not None and key != stop_at:
                    h.value(vtype, keep=False)
                    continue
                self.fields[key] = GGUFField(h.value(vtype))
                if stop_at is not None:
                    return                                        # the one key asked for
            if stop_at is not None:
                return
            infos = []
            for _ in range(n_tensors):
                name = h.string()
                dims = [h.num("Q") for _ in range(h.num("I"))]
                infos.append((name, dims, h.num("I"), h.num("Q")))
            align = int(self.fields.get("general.alignment", GGUFField(32)).value)
            start = -(-f.tell() // align) * align
        self._build_tensors(path, size, start, infos)

    def _build_tensors(self, path, size: int, start: int, infos: list) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        floats = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
        mm = np.memmap(path, mode="r", dtype=np.uint8)
        for name, dims, raw_type, offset in infos:
            qtype = GGMLQuantizationType(raw_type)
            shape = tuple(reversed(dims))
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_elems = int(np.prod(dims, dtype=np.int64))
            n_bytes = n_elems * type_size // block
            lo = start + offset
            if lo + n_bytes > size:
                raise ValueError(f"tensor {name} runs past the end of the file")
            raw = mm[lo: lo + n_bytes]
            data = raw.view(floats[qtype]).reshape(shape) if qtype in floats else \
                raw.reshape(quant_shape_to_byte_shape(shape, qtype))
            self.tensors.append(GGUFTensor(name, np.array(dims, dtype=np.uint64), qtype, data))


def open_gguf(path) -> GGUFFile:
    try:
        return GGUFFile(path)
    except (OSError, ValueError, OverflowError, KeyError, struct.error) as exc:
        raise SpecDecError(f"cannot read GGUF file {path}: {exc}") from None


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def header_field(path, key, default=None):
    """One scalar or string of a GGUF file's metadata, read by walking the header and skipping what comes before
    it (`specdec serve`'s start reads general.file_type so)."""
    try:
        value = field(GGUFFile(path, stop_at=key), key, default)
    except (OSError, ValueError, OverflowError, struct.error) as exc:
        raise SpecDecError(f"cannot read GGUF file {path}: {exc}") from None
    if isinstance(value, list):
        raise SpecDecError(f"cannot read GGUF file {path}: {key} is not a scalar or a string")
    return value
