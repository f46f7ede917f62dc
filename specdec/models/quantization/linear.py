"""The int4 linear method: block-quantized weights (see blocks.py) times int8-quantized activations.

Batch invariance: each activation row is quantized on its own and the kernel accumulates in int32 with
a fixed order, so a row's output is bit-identical whether it shares the forward with 0 or 500 other
rows. No row padding is needed (unlike the oneDNN bf16 path).
"""
from __future__ import annotations

import torch
from torch import nn

from ..hugepages import in_huge_pages
from .blocks import PackedBlocks
from .kernels import IMPLS, load_kernels


class BlockQuantLinear(nn.Module):
    impl = "auto"   # class-wide: "portable" forces the scalar kernel (tests compare the two)

    def __init__(self, packed: PackedBlocks, bias: torch.Tensor | None):
        super().__init__()
        self._C = load_kernels()
        self.packed = packed.map(in_huge_pages)      # streamed every token: 2 MB pages (see models/hugepages.py)
        self.out_features, self.in_features = packed.out_features, packed.in_features
        self.padded = packed.qw.shape[0] * 16          # kernel output columns (a multiple of 16)
        self.bias = None
        if bias is not None:
            self.bias = torch.zeros(self.padded)
            self.bias[: self.out_features] = bias.detach().float()
        self.nbytes = packed.nbytes + (0 if bias is None else self.bias.nbytes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features] in x's dtype (fp32 accumulation inside; the kernel
        # returns bf16 for bf16 input, fp32 otherwise)
        p = self.packed
        out = self._C.qlinear(x.reshape(-1, self.in_features), p.qw, p.sc, p.mn, p.dm, self.bias,
                              p.bits, p.group, p.sb, IMPLS[self.impl])
        if self.padded != self.out_features:
            out = out[:, : self.out_features]
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        p = self.packed
        return f"in={self.in_features}, out={self.out_features}, bits={p.bits}, group={p.group}, sb={p.sb}"
