"""Logits -> probabilities under temperature, top-k, top-p and min-p; sampling with a generator.

The same function is applied to the target's and the draft's logits, so the rejection test compares
the two distributions the user actually asked for.
"""
from __future__ import annotations

import torch


def probs_from_logits(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0,
                      min_p: float = 0.0) -> torch.Tensor:
    """logits [N, V] (fp32) -> probs [N, V]; temperature must be > 0 (greedy never needs probs).

    Order (HF's and vLLM's): temperature, top-k, top-p, min-p.
    """
    logits = logits.float() / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # keep the smallest prefix whose mass reaches top_p
        drop_sorted[..., 0] = False         # and always the top token (cumsum rounding can exceed a tiny top_p)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)
    return probs / probs.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """probs [N, V] -> token ids [N] (one draw per row)."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
