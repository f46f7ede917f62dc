"""Block-quantized weights: codes, two-level scales, and the packed layout the CPU kernel reads.

A weight is  w[n, k] = d[n, s] * sc[n, g] * q[n, k] - dmin[n, s] * mn[n, g]  with q an unsigned 3-, 4-, 6- or
8-bit code, g a group of `group` consecutive k and s a superblock of `sb` groups (llama.cpp's K-quant
form; GGUF's Q4_K, Q6_K, Q8_0 and Q5_0 blocks are all exact instances of it, see gguf_blocks.py).
`BlockCodes` holds that form unpacked (easy to build, check, concatenate); `pack` lays it out for the
kernel (see csrc/qlinear.h). Tensors of one linear are fused (qkv, gate_up) by concatenating codes
along N; formats that differ are first widened losslessly to a common one.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

FORMAT_VERSION = 2       # of the packed layout; part of the conversion-cache key (v2: 6-bit codes for Q6_K)
INT4_GROUP = 32          # k per group (scale and offset per group, as in Q4_K)
INT4_SUPERBLOCK = 8      # groups per superblock: 256 k share one fp16 d and dmin


@dataclass
class BlockCodes:
    q: torch.Tensor        # uint8 [N, K] codes, 0 .. 2**bits - 1
    sc: torch.Tensor       # int8  [N, NG] per-group scale multiplier
    mn: torch.Tensor       # int8  [N, NG] per-group offset multiplier
    d: torch.Tensor        # fp16  [N, NS]
    dmin: torch.Tensor     # fp16  [N, NS]
    bits: int
    group: int
    sb: int                # groups per superblock (the last superblock of a row may be partial)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def span(self) -> int:  # k per superblock
        return self.group * self.sb

    def check(self) -> BlockCodes:
        n, k = self.q.shape
        ng = k // self.group
        ns = -(-ng // self.sb)
        assert k % self.group == 0 and self.bits in (3, 4, 6, 8) and self.group in (16, 32), (k, self.bits, self.group)
        assert self.bits != 3 or self.group == 32, "3-bit codes come in groups of 32"
        assert self.sc.shape == self.mn.shape == (n, ng) and self.d.shape == self.dmin.shape == (n, ns)
        assert int(self.q.max()) < (1 << self.bits) if self.q.numel() else True
        return self


def dequantize(c: BlockCodes) -> torch.Tensor:
    """codes -> fp32 [N, K]: the exact represented value, rounded once to fp32 (computed in fp64)."""
    n, k = c.q.shape
    g_of_s = torch.arange(c.sc.shape[1]) // c.sb
    scale = c.d.double()[:, g_of_s] * c.sc.double()          # [N, NG]
    offset = c.dmin.double()[:, g_of_s] * c.mn.double()
    w = c.q.double().view(n, -1, c.group) * scale[..., None] - offset[..., None]
    return w.view(n, k).float()


def quantize_int4(w: torch.Tensor) -> BlockCodes:
    """Float weights [N, K] -> 4-bit codes, group 32, asymmetric (scale and min per group), Q4_K-shaped.

    Plain min-max per group (the range always includes 0, so the offset is never negative), then the
    group scales and mins are themselves quantized to 6 bits against a per-superblock fp16 d and dmin.
    """
    return quantize_blocks(w, 4)


SEARCH_SHRINK = (1.0, 0.9, 0.8, 0.7)


def quantize_blocks(w: torch.Tensor, bits: int, search: bool = False,
                    importance: torch.Tensor | None = None) -> BlockCodes:
    """quantize_int4's recipe with 2**bits - 1 levels (3 or 4 bits). search: per group, the range shrunk at either
    end by each factor of SEARCH_SHRINK with the least squared error (plain rounding inside it) instead of the
    whole min-max range; what a 3-bit draft's layers need (docs/benchmarks/draft-bits). importance [K]: each input's
    weight in that error (an importance matrix, as llama.cpp's; tried there, no better for the draft)."""
    n, k = w.shape
    if k % INT4_GROUP:
        raise ValueError(f"int{bits} needs in_features divisible by {INT4_GROUP}, got {k}")
    levels = (1 << bits) - 1
    g = w.float().reshape(n, -1, INT4_GROUP)                      # [N, NG, 32]
    ng = g.shape[1]
    ns = -(-ng // INT4_SUPERBLOCK)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    if search:
        lo, hi = _searched_range(g, lo, hi, levels, None if importance is None else importance.view(1, ng, INT4_GROUP))
    scale_f, offs_f = (hi - lo) / levels, -lo                     # [N, NG]
    pad = ns * INT4_SUPERBLOCK - ng

    def two_level(v):  # [N, NG] >= 0 -> (fp16 [N, NS], int8 [N, NG] in 0..63)
        vs = torch.nn.functional.pad(v, (0, pad)).view(n, ns, INT4_SUPERBLOCK)
        top = (vs.amax(-1) / 63).half()
        t = top.float().repeat_interleave(INT4_SUPERBLOCK, 1)[:, :ng]
        mult = torch.where(t > 0, torch.round(v / t.clamp(min=1e-30)), torch.zeros_like(v)).clamp(0, 63)
        return top, mult.to(torch.int8)

    d, sc = two_level(scale_f)
    dmin, mn = two_level(offs_f)
    g_of_s = torch.arange(ng) // INT4_SUPERBLOCK
    step = d.float()[:, g_of_s] * sc.float()                      # [N, NG]
    offs = dmin.float()[:, g_of_s] * mn.float()
    q = torch.where(step[..., None] > 0, torch.round((g + offs[..., None]) / step.clamp(min=1e-30)[..., None]),
                    torch.zeros_like(g)).clamp(0, levels)
    return BlockCodes(q.to(torch.uint8).view(n, k), sc, mn, d, dmin, bits, INT4_GROUP, INT4_SUPERBLOCK).check()


def _searched_range(g: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, levels: int, weight=None):
    """Per group (g: [N, NG, 32]), the (lo * a, hi * b) over a, b in SEARCH_SHRINK whose rounding errs least (each
    input's squared error times its weight [1, NG, 32], where given)."""
    best = blo = bhi = None
    for a in SEARCH_SHRINK:
        for b in SEARCH_SHRINK:
            l2, h2 = lo * a, hi * b
            step = ((h2 - l2) / levels).clamp(min=1e-30)
            q = torch.round((g - l2[..., None]) / step[..., None]).clamp(0, levels)
            err = (q * step[..., None] + l2[..., None] - g) ** 2
            err = (err if weight is None else err * weight).sum(-1)
            if best is None:
                best, blo, bhi = err, l2, h2
                continue
            take = err < best
            best, blo, bhi = torch.where(take, err, best), torch.where(take, l2, blo), torch.where(take, h2, bhi)
    return blo, bhi


def quantize_int8(w: torch.Tensor) -> BlockCodes:
    """Float weights [N, K] -> 8-bit codes, Q8_0-shaped: per group of 32 one fp16 scale d = amax / 127 and codes
    round(w / d) in -127..127, stored as code + 128 (so sc = mn = 1, sb = 1 and dmin = 128 d, exact in fp16)."""
    n, k = w.shape
    if k % INT4_GROUP:
        raise ValueError(f"int8 blocks need in_features divisible by {INT4_GROUP}, got {k}")
    from ..quant import quantize_rows_int8

    code, d = quantize_rows_int8(w.reshape(-1, INT4_GROUP), torch.float16)     # one row per group: [N*NG, 32]
    d = d.view(n, -1)                                                           # [N, NG]
    ones = torch.ones(d.shape, dtype=torch.int8)
    return BlockCodes((code.view(n, k).to(torch.int16) + 128).to(torch.uint8), ones, ones, d,
                      (d.float() * 128).half(), 8, INT4_GROUP, 1).check()


def widen(c: BlockCodes, bits: int, group: int, span: int) -> BlockCodes:
    """The same weights in a format with more bits, smaller groups or shorter superblocks (lossless)."""
    assert bits >= c.bits and c.group % group == 0 and c.span % span == 0 and span % group == 0
    split_g, split_s = c.group // group, c.span // span
    n, k = c.q.shape
    ng_new = k // group
    ns_new = -(-ng_new // (span // group))
    d = c.d.repeat_interleave(split_s, 1)[:, :ns_new]
    dmin = c.dmin.repeat_interleave(split_s, 1)[:, :ns_new]
    return BlockCodes(c.q, c.sc.repeat_interleave(split_g, 1), c.mn.repeat_interleave(split_g, 1),
                      d.contiguous(), dmin.contiguous(), bits, group, span // group).check()


def take_rows(c: BlockCodes, index) -> BlockCodes:
    """Rows `index` of the codes, in that order (a block never spans rows, so any row order is exact)."""
    index = torch.as_tensor(index, dtype=torch.long)
    return replace(c, q=c.q[index], sc=c.sc[index], mn=c.mn[index], d=c.d[index], dmin=c.dmin[index]).check()


def concat(parts: list[BlockCodes]) -> BlockCodes:
    """Stack along N (fused qkv / gate_up), widening to a common format where the parts differ."""
    if len({(p.bits, p.group, p.sb) for p in parts}) > 1:
        bits, group = max(p.bits for p in parts), min(p.group for p in parts)
        span = min(p.span for p in parts)
        parts = [widen(p, bits, group, span) for p in parts]
    first = parts[0]
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])
    return replace(first, q=cat("q"), sc=cat("sc"), mn=cat("mn"), d=cat("d"), dmin=cat("dmin")).check()


@dataclass
class PackedBlocks:
    """The kernel's layout (csrc/qlinear.h); what the conversion cache stores for a quantized linear."""
    qw: torch.Tensor       # uint8 [N/16, NG, group*16*bits/8] (bits 3, 4, 6 or 8)
    sc: torch.Tensor       # int8  [N/16, NG, 16]
    mn: torch.Tensor       # int8  [N/16, NG, 16]
    dm: torch.Tensor       # fp16  [N/16, NS, 2, 16]
    bits: int
    group: int
    sb: int
    n: int                 # out_features; the packed rows are padded with zeros to a multiple of 16

    TENSORS = ("qw", "sc", "mn", "dm")

    @property
    def out_features(self) -> int:
        return self.n

    @property
    def in_features(self) -> int:
        return self.qw.shape[1] * self.group

    @property
    def nbytes(self) -> int:    # a tensor shared by two fields (mn = sc) counts once
        seen = {id(getattr(self, t)): getattr(self, t).nbytes for t in self.TENSORS}
        return sum(seen.values())

    def share_equal_scales(self) -> bool:
        """Q6_K, Q8_0 and Q5_0 blocks have mn == sc (the offset is the scale times a constant, folded into dmin):
        keep one copy, so the kernel streams 0.5 fewer bits per weight. Returns whether they were shared."""
        if self.mn is not self.sc and self.mn.shape == self.sc.shape and torch.equal(self.mn, self.sc):
            self.mn = self.sc
        return self.mn is self.sc

    def map(self, fn) -> PackedBlocks:
        """The same blocks with fn applied to each tensor (a tensor shared by two fields stays shared)."""
        done: dict[int, torch.Tensor] = {}
        for t in self.TENSORS:
            v = getattr(self, t)
            if id(v) not in done:
                done[id(v)] = fn(v)
        return replace(self, **{t: done[id(getattr(self, t))] for t in self.TENSORS})

    def select_rows(self, rows: torch.Tensor) -> PackedBlocks:
        """The blocks of output rows `rows` (in that order), without unpacking: every tensor of the layout keeps a
        row's bytes at (its block of 16, its column in the block), so rows are gathered from there and laid out
        again in blocks of 16 (zero-padded: their outputs are dropped, like pack's)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        n = int(rows.numel())
        blk, col = rows // 16, rows % 16
        padded = -(-n // 16) * 16

        def gather(t, cdim):  # t's rows live at (dim 0, dim cdim): -> [n, rest...] in the remaining dims' order
            moved = t.movedim(cdim, 1)                                  # [nb, 16, rest...]
            picked = moved[blk, col]                                    # [n, rest...]
            pad = picked.new_zeros(padded - n, *picked.shape[1:])
            return torch.cat([picked, pad]).view(padded // 16, 16, *picked.shape[1:]).movedim(1, cdim).contiguous()

        nb, ng = self.qw.shape[:2]
        qw = gather(self.qw.view(nb, ng, -1, 16, 4), 3).view(padded // 16, ng, -1)   # chunk, column, 4 bytes
        sc = gather(self.sc, 2)
        mn = sc if self.mn is self.sc else gather(self.mn, 2)
        dm = gather(self.dm, 3)
        return PackedBlocks(qw, sc, mn, dm, self.bits, self.group, self.sb, n)

    def format(self) -> str:
        return f"{self.bits},{self.group},{self.sb},{self.n}"

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], fmt: str) -> PackedBlocks:
        bits, group, sb, n = (int(v) for v in fmt.split(","))
        return cls(*(tensors[t] for t in cls.TENSORS), bits, group, sb, n)


def pack(c: BlockCodes) -> PackedBlocks:
    n_out, k = c.q.shape
    if n_out % 16:   # zero rows (scales 0) up to a whole column block; their outputs are dropped
        rows = 16 - n_out % 16
        pad = lambda t: torch.cat([t, t.new_zeros(rows, t.shape[1])])
        c = replace(c, q=pad(c.q), sc=pad(c.sc), mn=pad(c.mn), d=pad(c.d), dmin=pad(c.dmin))
    n = c.q.shape[0]
    nb, ng = n // 16, k // c.group
    q = c.q.view(nb, 16, ng, c.group)
    if c.bits == 8:   # byte c*4+t of chunk j = q[c, 4j+t]
        qw = q.view(nb, 16, ng, c.group // 4, 4).permute(0, 2, 3, 1, 4).reshape(nb, ng, -1)
    elif c.bits == 3:  # 2-bit plane: chunk h, byte c*4+t, bits 2j..2j+1 = q[c, 16h+4j+t] & 3; then the 1-bit plane:
        low = (q & 3).view(nb, 16, ng, c.group // 16, 4, 4)   # byte c*4+t, bit j = bit 2 of q[c, 4j+t]
        plane2 = low[..., 0, :] | (low[..., 1, :] << 2) | (low[..., 2, :] << 4) | (low[..., 3, :] << 6)
        top = (q >> 2).view(nb, 16, ng, c.group // 4, 4)
        plane1 = sum(top[..., j, :] << j for j in range(c.group // 4)).to(torch.uint8)
        qw = torch.cat([plane2.permute(0, 2, 3, 1, 4).reshape(nb, ng, -1),
                        plane1.permute(0, 2, 1, 3).reshape(nb, ng, -1)], dim=2)
    else:             # chunk i: low nibble q[c, 8i+t], high nibble q[c, 8i+4+t] (low 4 bits of each code)
        lo = (q & 15).view(nb, 16, ng, c.group // 8, 2, 4)
        qw = (lo[..., 0, :] | (lo[..., 1, :] << 4)).permute(0, 2, 3, 1, 4).reshape(nb, ng, -1)
        if c.bits == 6:  # + top-2-bit plane: chunk h, byte c*4+t, bits 2j..2j+1 = q[c, 16h+4j+t] >> 4
            hi = (q >> 4).view(nb, 16, ng, c.group // 16, 4, 4)
            plane = hi[..., 0, :] | (hi[..., 1, :] << 2) | (hi[..., 2, :] << 4) | (hi[..., 3, :] << 6)
            qw = torch.cat([qw, plane.permute(0, 2, 3, 1, 4).reshape(nb, ng, -1)], dim=2)
    per_col = lambda t: t.view(nb, 16, -1).transpose(1, 2).contiguous()     # [N, X] -> [N/16, X, 16]
    dm = torch.stack([per_col(c.d), per_col(c.dmin)], dim=2)                # [N/16, NS, 2, 16]
    return PackedBlocks(qw.contiguous(), per_col(c.sc), per_col(c.mn), dm.contiguous(),
                        c.bits, c.group, c.sb, n_out)
