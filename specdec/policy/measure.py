"""Measure the cost model on this machine: a target forward over n = 1..K+1 tokens, one draft step, one n-gram
lookup — each the median of a few timed repeats after a warm-up, at a realistic context length.
"""
from __future__ import annotations

import statistics
import time

import torch

from .cost_model import CostModel


def _forward_time(model, n: int, context: int, repeats: int) -> float:
    """Median seconds of one forward over n new tokens after `context` cached ones."""
    from ..models.runner import Span, forward_spans

    device = model.embed_tokens.weight.device
    vocab = model.embed_tokens.weight.shape[0]
    context = min(context, model.config.max_position_embeddings - n - 2)
    kv = model.new_kv()
    kv.resize(-(-(context + n + 1) // model.key_block) * model.key_block)
    forward_spans(model, [Span(kv, 0, [(i * 31 + 7) % vocab for i in range(context)], "none")])   # the context
    step = [(i * 17 + 3) % vocab for i in range(n)]
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        forward_spans(model, [Span(kv, context, step, "last", decode=True)])   # as the engine verifies
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:                                     # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def large_row_points(k_max: int, max_rows: int) -> list[int]:
    """Row counts measured past k_max + 1, up to a full batch of drafts (max_num_seqs x (k_max + 1))."""
    pts, n = [], k_max + 2
    while n < max_rows:
        n = max(n, round(n * 1.5))
        pts.append(min(n, max_rows))
        n += 1
    return sorted(set(pts))


@torch.inference_mode()
def measure_cost_model(target, draft=None, lookup=None, k_max: int = 8, context: int = 256,
                       repeats: int = 5, max_rows: int = 0) -> CostModel:
    """target/draft: Transformer models; lookup(token_ids) -> proposal, the n-gram proposer's search.

    V(n) = t(n) / t(1) for n = 1..k_max+1 and at a few row counts up to `max_rows` (a batched step);
    c = draft step / target step; lookup cost / target step.
    """
    t = [_forward_time(target, n, context, repeats) for n in range(1, k_max + 2)]
    verify = [x / t[0] for x in t]
    large = [[n, _forward_time(target, n, context, max(2, repeats // 2)) / t[0]]
             for n in large_row_points(k_max, max_rows)]
    c = _forward_time(draft, 1, context, repeats) / t[0] if draft is not None else float("inf")
    cost = _lookup_time(lookup, context) / t[0] if lookup is not None else 0.0
    return CostModel(draft_step=c, verify=verify, verify_large=large, lookup=cost, target_step_s=t[0],
                     source="measured")


def _lookup_time(lookup, context: int) -> float:
    tokens = [(i * 7919) % 997 for i in range(context * 4)]      # few repeats: the search runs to its end
    t0 = time.perf_counter()
    for _ in range(20):
        lookup(tokens)
    return (time.perf_counter() - t0) / 20
