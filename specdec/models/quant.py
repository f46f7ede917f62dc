"""Weight-only int8 linears (per-output-channel symmetric scales) for cheap one-token steps.

Used for the draft model: a draft step is one token at a time, where reading half the bytes of bf16
makes the step cheaper; the draft's output only steers proposals, so any precision loss costs
acceptance, never correctness (verification keeps the target's distribution exact).
"""
from __future__ import annotations

import torch
from torch import nn


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act_dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w = weight.float()
        scales = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0                     # [out]
        self.weight_int8 = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scales = scales.to(act_dtype)
        self.bias = None if bias is None else bias.detach().to(act_dtype).clone()
        self.act_dtype = act_dtype
        self.nbytes = self.weight_int8.nbytes + self.scales.nbytes + (0 if bias is None else self.bias.nbytes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features]
        x2 = x.reshape(-1, self.in_features).to(self.act_dtype)
        out = torch.ops.aten._weight_int8pack_mm(x2, self.weight_int8, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

