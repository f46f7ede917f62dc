"""Weight-only int8 linears (per-output-channel symmetric scales) for cheap one-token steps.

Used for the draft model: a draft step is one token at a time, where reading half the bytes of bf16
makes the step cheaper; the draft's output only steers proposals, so any precision loss costs
acceptance, never correctness (verification keeps the target's distribution exact).
"""
from __future__ import annotations

import torch
from torch import nn


def quantize_rows_int8(w: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """w [R, C] -> (codes int8 [R, C], scale [R] in scale_dtype): symmetric per row, round to nearest.

    scale = amax / 127, rounded to scale_dtype first; codes = round(w / scale) in -127..127 against that rounded
    scale, so codes * scale is the represented value. An all-zero row gets scale 0 and codes 0. The one int8
    rounding rule of the package: Int8Linear (a row per output channel), int8 head files (models/heads.py) and
    Q8_0-shaped blocks (quantization/blocks.py: a row per group of 32, fp16 scales) all use it.
    """
    w = w.float()
    scale = (w.abs().amax(-1) / 127).to(scale_dtype)                          # [R]
    step = scale.float()[:, None]
    codes = torch.where(step > 0, torch.round(w / step.clamp(min=1e-30)), torch.zeros_like(w)).clamp(-127, 127)
    return codes.to(torch.int8), scale


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act_dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        codes, scales = quantize_rows_int8(weight)                               # [out, in], [out]
        self.weight_int8 = codes.contiguous()
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

