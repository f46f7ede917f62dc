"""Linear layers with weights pre-packed for oneDNN on CPU.

A plain `F.linear` on CPU re-lays-out the weight for oneDNN on every call, which roughly halves the
bandwidth a decode step gets from memory. Packing once at load time (what inductor's weight freezing
does) lets a bf16 decode step stream the weights at close to the machine's read bandwidth.
"""
from __future__ import annotations

import torch
from torch import nn


def can_pack(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float32)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)  # opaque oneDNN layout
        self.bias = None if bias is None else bias.detach().clone()
        self.nbytes = weight.nbytes + (0 if bias is None else bias.nbytes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features]
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed, self.bias,
                                                 "none", [None], "")
        return out.view(*x.shape[:-1], self.out_features)


def pack_linears(module: nn.Module) -> int:
    """Replace every eligible nn.Linear under `module` by a PackedLinear; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and can_pack(child.weight):
            setattr(module, name, PackedLinear(child.weight.data, None if child.bias is None else child.bias.data))
            count += 1
        else:
            count += pack_linears(child)
    return count
