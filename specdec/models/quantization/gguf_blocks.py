"""GGUF quantized tensors -> BlockCodes without loss.

Each supported GGUF block type is an instance of  w = d*sc*q - dmin*mn  (blocks.py):

| GGUF type | block | maps to | exact? |
|---|---|---|---|
| Q4_K | 256 k: fp16 d, dmin; 8 x (6-bit sc, 6-bit m); 4-bit q | bits 4, group 32, sb 8: sc, mn = sc, m | yes |
| Q6_K | 256 k: fp16 d; 16 x int8 sc; 6-bit q (-32..31) | bits 6, group 16, sb 16: q+32, mn = sc, dmin = 32 d | yes |
| Q8_0 | 32 k: fp16 d; int8 q | bits 8, group 32, sb 1: q+128, sc = mn = 1, dmin = 128 d | yes |
| Q5_0 | 32 k: fp16 d; 5-bit q (q-16) | bits 8, group 32, sb 1: q, sc = mn = 1, dmin = 16 d | yes |

Multiplying an fp16 d by 16, 32 or 128 is exact (a power of two). Codes are read from the raw blocks
for Q4_K; for the others they are recovered from gguf's own dequantization (w / (d*sc) is an exact
integer in fp64), and every conversion is checked: our dequantization must equal gguf's bit for bit.
Other types (and F16/F32 tensors) go through float and `quantize_int4`, which rounds.
"""
from __future__ import annotations

import numpy as np
import torch

from ...errors import SpecDecError
from .blocks import BlockCodes, concat, dequantize, quantize_blocks, quantize_int4

EXACT_TYPES = ("Q4_K", "Q6_K", "Q8_0", "Q5_0")

DEQUANT_ROWS = 64   # rows per call of gguf's row function: its public dequantize walks 16 at a time, 2x slower here


def gguf_dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """gguf's own dequantization of a block-quantized array ([rows, bytes] -> float32 [rows, k]), its row function
    called on runs of DEQUANT_ROWS rows: the same arithmetic as gguf.quants.dequantize, in half the time on a 1.5B
    file (whose every tensor the conversion dequantizes, to check the codes it keeps). A type without a row
    function goes through gguf.quants.dequantize."""
    import gguf

    arr = np.asarray(data)
    cls = getattr(gguf.quants, qtype.name, None)
    if cls is None or not hasattr(cls, "dequantize_rows"):
        return gguf.quants.dequantize(arr, qtype)
    rows = arr.reshape(-1, arr.shape[-1])
    cls.init_grid()
    runs = (rows[i:i + DEQUANT_ROWS] for i in range(0, len(rows), DEQUANT_ROWS))
    return np.concatenate([cls.dequantize_rows(run).reshape(len(run), -1) for run in runs])


def _q4_k(raw: np.ndarray, n: int, k: int) -> BlockCodes:
    b = raw.reshape(-1, 144)                                   # one row of the block table per 256 k
    d = b[:, 0:2].copy().view(np.float16)[:, 0]
    dmin = b[:, 2:4].copy().view(np.float16)[:, 0]
    s = b[:, 4:16].astype(np.uint8)
    # 12 bytes hold 8 six-bit scales and 8 six-bit mins: bytes 0-3 / 4-7 carry sc / m of groups 0-3 in
    # their low 6 bits and the top 2 bits of groups 4-7; bytes 8-11 carry the low 4 bits of groups 4-7.
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    qs = b[:, 16:144].reshape(-1, 4, 32)                       # 4 x 32 bytes: groups 2j (low), 2j+1 (high)
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 256)
    t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a).astype(dt))
    return BlockCodes(t(q, np.uint8).view(n, k), t(sc, np.int8).view(n, -1), t(mn, np.int8).view(n, -1),
                      t(d, np.float16).view(n, -1), t(dmin, np.float16).view(n, -1), 4, 32, 8)


def _from_dequantized(w: np.ndarray, d: np.ndarray, sc: np.ndarray, zero: int, group: int, sb: int,
                      bits: int = 8) -> BlockCodes:
    """Symmetric formats: w = d*sc*(code - zero); recover code exactly from gguf's float output."""
    n, k = w.shape
    step = (d.astype(np.float64).repeat(sb, axis=1)[:, : k // group] * sc)             # [N, NG]
    wg = w.reshape(n, -1, group).astype(np.float64)
    safe = np.where(step == 0, 1.0, step)[..., None]
    q = np.where(step[..., None] == 0, 0.0, np.rint(wg / safe)) + zero
    t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a).astype(dt))
    d16 = d.astype(np.float16)
    return BlockCodes(t(q.reshape(n, k), np.uint8), t(sc, np.int8), t(sc, np.int8), t(d16, np.float16),
                      t(d16.astype(np.float32) * zero, np.float16), bits, group, sb)


ROW_CHUNK = 8192   # rows converted at a time: the fp64 checks of a 151936-row head would need ~8 GB at once


def codes_from_gguf(tensor) -> BlockCodes:
    """A GGUFReader tensor of an exact type -> codes in PyTorch's [out, in] layout, checked lossless."""
    name = tensor.tensor_type.name
    if name not in EXACT_TYPES:
        raise SpecDecError(f"GGUF tensor {tensor.name}: {name} has no exact block mapping")
    n, k = (int(v) for v in reversed(tensor.shape))
    raw = np.asarray(tensor.data).view(np.uint8).reshape(n, -1)
    return concat([_codes_from_rows(raw[i:i + ROW_CHUNK], k, tensor.tensor_type, tensor.name)
                   for i in range(0, n, ROW_CHUNK)])


def _codes_from_rows(raw: np.ndarray, k: int, qtype, tensor_name: str) -> BlockCodes:
    name, n = qtype.name, raw.shape[0]
    ref = gguf_dequantize(raw, qtype).reshape(n, k)
    if name == "Q4_K":
        codes = _q4_k(raw, n, k)
    elif name == "Q6_K":
        b = raw.reshape(-1, 210)
        sc = b[:, 192:208].copy().view(np.int8).reshape(n, -1)                  # [N, K/16]
        d = b[:, 208:210].copy().view(np.float16).reshape(n, -1)               # [N, K/256]
        codes = _from_dequantized(ref, d, sc, 32, 16, 16, bits=6)
    else:  # Q8_0 (34-byte blocks), Q5_0 (22-byte blocks): fp16 d first, one scale per 32 k
        size = 34 if name == "Q8_0" else 22
        d = raw.reshape(-1, size)[:, 0:2].copy().view(np.float16).reshape(n, -1)
        codes = _from_dequantized(ref, d, np.ones(d.shape, np.int8), 128 if name == "Q8_0" else 16, 32, 1)
    codes.check()
    if not torch.equal(dequantize(codes), torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32))):
        raise SpecDecError(f"GGUF tensor {tensor_name}: {name} -> block codes is not lossless (a bug)")
    return codes


def codes_for_bits(tensor, bits: int) -> BlockCodes:
    """A GGUF tensor re-quantized to `bits` (3: a draft's MLP) from gguf's float dequantization, with a searched
    range per group (blocks.quantize_blocks)."""
    return quantize_blocks(dequantized(tensor), bits, search=True)


def tensor_floats(tensor) -> np.ndarray:
    """One GGUF tensor's values as float32 in PyTorch's [out, in] layout (GGUF lists dims innermost first), as gguf
    dequantizes them; F32 and F16 as they are. A type gguf cannot dequantize is one SpecDecError line."""
    import gguf

    qtype = tensor.tensor_type
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        out = np.asarray(tensor.data, dtype=np.float32)
    elif qtype == gguf.GGMLQuantizationType.BF16:
        out = np.asarray(gguf.quants.dequantize(tensor.data, qtype), dtype=np.float32)
    else:
        try:
            out = gguf_dequantize(np.asarray(tensor.data), qtype)   # gguf's arithmetic, in longer runs of rows
        except NotImplementedError:
            raise SpecDecError(f"GGUF tensor {tensor.name}: quantization {qtype.name} is not supported") from None
    return out.reshape(tuple(int(d) for d in reversed(tensor.shape)))


def dequantized(tensor) -> torch.Tensor:
    """A GGUF tensor's weights as a contiguous fp32 tensor [N, K] (tensor_floats)."""
    return torch.from_numpy(np.ascontiguousarray(tensor_floats(tensor), dtype=np.float32))


def codes_for_int4(tensor, exact: bool = True) -> BlockCodes:
    """What the int4 scheme stores for one GGUF tensor: exact codes where the type allows (Q6_K keeps
    6-bit codes, Q8_0 and Q5_0 8-bit ones), else (or with exact=False, for all but Q4_K) 4-bit codes re-quantized from
    gguf's float dequantization, which rounds."""
    name = tensor.tensor_type.name
    if name == "Q4_K" or (exact and name in EXACT_TYPES):
        return codes_from_gguf(tensor)
    return quantize_int4(dequantized(tensor))
