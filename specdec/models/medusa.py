"""Medusa heads: K small heads over the target's last hidden state; head i guesses the token i + 2 places ahead.

Head i is `num_layers` residual blocks (x + SiLU(W x + b)) and its own output head, over the full vocabulary or a
truncated one (`token_map`: the target id of each of its rows). The weights load from vLLM's layout
(`blocks.{i}.layers.{j}`, `lm_heads.{i}`, `token_map`) or the Medusa authors' (`{i}.{j}.linear`, `{i}.{num_layers}`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class MedusaConfig:
    hidden_size: int
    vocab_size: int                     # the target's vocabulary
    num_heads: int
    num_layers: int = 1                 # residual blocks per head
    truncated_vocab_size: int = 0       # 0: the full vocabulary
    target: str = ""

    def __post_init__(self):
        self.truncated_vocab_size = self.truncated_vocab_size or self.vocab_size

    @classmethod
    def from_hf(cls, cfg: dict) -> MedusaConfig:
        return cls(hidden_size=cfg["hidden_size"], vocab_size=cfg["vocab_size"],
                   num_heads=cfg.get("num_heads") or cfg["medusa_num_heads"],
                   num_layers=cfg.get("num_hidden_layers") or cfg.get("medusa_num_layers", 1),
                   truncated_vocab_size=cfg.get("truncated_vocab_size") or 0,
                   target=cfg.get("specdec_target", ""))

    def to_hf(self) -> dict:
        return {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": self.hidden_size,
                "vocab_size": self.vocab_size, "num_heads": self.num_heads, "num_hidden_layers": self.num_layers,
                "truncated_vocab_size": self.truncated_vocab_size, "specdec_target": self.target}


class ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)        # Medusa's start: every head begins as the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    method = "medusa"         # the speculative method it drafts for (its declaration: proposers/medusa.py)
    def __init__(self, cfg: MedusaConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(H) for _ in range(cfg.num_layers)))
                                    for _ in range(cfg.num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(H, cfg.truncated_vocab_size, bias=False)
                                      for _ in range(cfg.num_heads))
        self.register_buffer("token_map", torch.arange(cfg.truncated_vocab_size, dtype=torch.long))

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> list[torch.Tensor]:
        """hidden [N, H] (the target's final, normed hidden state) -> per head logits [N, head vocab] fp32."""
        n = self.cfg.num_heads if num_heads is None else num_heads
        return [self.lm_heads[i](self.blocks[i](hidden)).float() for i in range(n)]

    def weight_nbytes(self) -> int:
        packed = sum(m.nbytes for m in self.modules() if isinstance(getattr(m, "nbytes", None), int))
        return packed + sum(p.nbytes for p in self.parameters()) + self.token_map.nbytes
