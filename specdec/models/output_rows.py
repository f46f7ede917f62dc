"""Any rows of a model's whole output head, on demand, where the head it runs was cut to some of them (a draft's
head cut to the tokens its target emits, loader.keep_output_rows): a request whose prompt holds tokens outside the
cut gets logits for those too, from a small linear over their rows."""
from __future__ import annotations

import torch
from torch import nn


class OutputRows:
    def __init__(self, full):
        self.full = full            # quantization.blocks.PackedBlocks of the whole head, or its float weight [V, H]

    def linear(self, token_ids: torch.Tensor) -> nn.Module:
        """A linear whose output j is the whole head's row token_ids[j]  # [..., H] -> [..., len(token_ids)]."""
        from .quantization.blocks import PackedBlocks

        ids = torch.as_tensor(token_ids, dtype=torch.long)
        if isinstance(self.full, PackedBlocks):
            from .quantization.linear import BlockQuantLinear

            return BlockQuantLinear(self.full.select_rows(ids.cpu()), None)
        w = self.full
        lin = nn.Linear(w.shape[1], len(ids), bias=False, dtype=w.dtype, device=w.device)
        lin.weight = nn.Parameter(w[ids.to(w.device)].clone(), requires_grad=False)
        return lin

    def whole(self) -> nn.Module:
        """A linear over every row of the whole head, in order  # [..., H] -> [..., V] (a float head shares its
        weight; block-quantized rows are laid in 2 MB pages, as every streamed linear)."""
        from .quantization.blocks import PackedBlocks

        if isinstance(self.full, PackedBlocks):
            from .quantization.linear import BlockQuantLinear

            return BlockQuantLinear(self.full, None)
        lin = nn.Linear(self.full.shape[1], self.full.shape[0], bias=False, dtype=self.full.dtype,
                        device=self.full.device)
        lin.weight = nn.Parameter(self.full, requires_grad=False)
        return lin
