"""Measure the cost model on this machine: a target forward over n = 1..K+1 tokens, one draft step, one n-gram
lookup — each the median of a few timed repeats after a warm-up, at a realistic context length.
"""
from __future__ import annotations

import statistics
import time

import torch

from .cost_model import CostModel


def _forward_time(model, n: int, context: int, repeats: int) -> float:
    device = model.embed_tokens.weight.device
    vocab = model.embed_tokens.weight.shape[0]
    context = min(context, model.config.max_position_embeddings - n - 2)
    cache = model.new_kv_cache(context + n + 1)
    ids = (torch.arange(context, device=device)[None] * 31 + 7) % vocab
    model(ids, torch.arange(context, device=device)[None], cache)          # the context, once
    step = (torch.arange(n, device=device)[None] * 17 + 3) % vocab
    pos = torch.arange(context, context + n, device=device)[None]
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        hidden = model(step, pos, cache)
        model.compute_logits(hidden[0, -1:])
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:                                     # the first is a warm-up
            times.append(time.perf_counter() - t0)
        cache.rollback(context)
    return statistics.median(times)


@torch.inference_mode()
def measure_cost_model(target, draft=None, lookup=None, k_max: int = 8, context: int = 256,
                       repeats: int = 5) -> CostModel:
    """target/draft: Transformer models; lookup(token_ids) -> proposal, the n-gram proposer's search.

    V(n) = t(n) / t(1); c = draft step / target step; lookup cost / target step.
    """
    t = [_forward_time(target, n, context, repeats) for n in range(1, k_max + 2)]
    verify = [x / t[0] for x in t]
    c = _forward_time(draft, 1, context, repeats) / t[0] if draft is not None else float("inf")
    cost = _lookup_time(lookup, context) / t[0] if lookup is not None else 0.0
    return CostModel(draft_step=c, verify=verify, lookup=cost, target_step_s=t[0], source="measured")


def _lookup_time(lookup, context: int) -> float:
    tokens = [(i * 7919) % 997 for i in range(context * 4)]      # few repeats: the search runs to its end
    t0 = time.perf_counter()
    for _ in range(20):
        lookup(tokens)
    return (time.perf_counter() - t0) / 20
