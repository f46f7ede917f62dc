"""Linear layers with weights pre-packed for oneDNN on CPU.

A plain `F.linear` on CPU re-lays-out the weight for oneDNN on every call, which roughly halves the
bandwidth a decode step gets from memory. Packing once at load time (what inductor's weight freezing
does) lets a bf16 decode step stream the weights at close to the machine's read bandwidth.

bf16 inputs of fewer than MIN_ROWS rows are zero-padded to MIN_ROWS. Measured on the 2-core EPYC with the
1.5B's layer shapes: oneDNN streams a packed bf16 weight at ~32 GB/s for one row but ~41 GB/s for 5-6
rows (its one-row kernel is a different, slower path), and every row count (1..400 measured) gives bit-identical
results per row. Padding therefore makes a one-token step faster *and* computes each row exactly as a
(k+1)-token verification forward does.
"""
from __future__ import annotations

import torch
from torch import nn


def can_pack(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float32)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


MIN_ROWS = 6
# Attention keys are padded (masked) to a multiple of this: CPU flash attention then sums each row in
# the same order whatever the number of query rows (measured: no mismatches at 64, some at 32).
KEY_BLOCK = 64


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)  # opaque oneDNN layout
        # float32: oneDNN's one-row path rounds differently from its 2..400-row path (measured: rows of M >= 2 are
        # bit-identical, M = 1 is not), so one row is padded to two and every batch size gives the same rows
        self.min_rows = MIN_ROWS if weight.dtype == torch.bfloat16 else 2
        self.bias = None if bias is None else bias.detach().clone()
        self.nbytes = weight.nbytes + (0 if bias is None else bias.nbytes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features]
        x2 = x.reshape(-1, self.in_features)
        rows = x2.shape[0]
        if rows < self.min_rows:
            x2 = torch.cat([x2, x2.new_zeros(self.min_rows - rows, self.in_features)])
        out = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [None], "")
        return out[:rows].view(*x.shape[:-1], self.out_features)

