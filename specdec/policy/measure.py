"""Measure the cost model on this machine: a target forward over n = 1..K+1 tokens, one draft step, one n-gram
lookup — each the minimum of a few interleaved timed rounds after a warm-up, at a realistic context length.
"""
from __future__ import annotations

import math
import time

import torch

from .cost_model import CostModel


def forward_times(model, ns: list[int], context: int, repeats: int) -> dict[int, float]:
    """Seconds of one forward over n new tokens after `context` cached ones, for each n in ns: the minimum over
    `repeats` rounds, each round timing every n once (interleaved, so a burst of load from elsewhere on a shared
    machine spoils one sample of many n rather than every sample of one n; the minimum is the quiet machine)."""
    kv, context = _primed_cache(model, context, max(ns))
    return _time_rows(model, kv, ns, context, repeats)


def _time_rows(model, kv, ns: list[int], context: int, repeats: int) -> dict[int, float]:
    from ..models.runner import Span, forward_spans

    device = model.embed_tokens.weight.device
    vocab = model.embed_tokens.weight.shape[0]
    best = {n: float("inf") for n in ns}
    for i in range(repeats + 1):
        for n in ns:
            step = [(j * 17 + 3) % vocab for j in range(n)]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward_spans(model, [Span(kv, context, step, "last", decode=True)])   # as the engine verifies
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i:                                     # the first round is a warm-up
                best[n] = min(best[n], time.perf_counter() - t0)
    return best


def _primed_cache(model, context: int, rows: int):
    """A fresh cache holding `context` rows (fewer where the model's positions end), with room for `rows` more ->
    (kv, context)."""
    context = min(context, model.config.max_position_embeddings - rows - 2)
    kv = model.new_kv()
    kv.resize(-(-(context + rows + 1) // model.key_block) * model.key_block)
    _extend(model, kv, 0, context)
    return kv, context


SEED_ROWS = 256      # rows prefilled for real; longer contexts repeat their keys and values


def _extend(model, kv, start: int, end: int) -> None:
    """Fill positions start..end-1 of kv (nothing when end <= start): the first SEED_ROWS by a real prefill of fixed
    tokens, the rest by repeating those rows' keys and values. What a forward costs depends on how many keys it
    reads, not on which (real values keep its softmax's exponents real); a real 4k-token prefill of the target and
    the draft took most of a fresh start's cost-model measurement on a 2-core AVX2 machine (168 s in all)."""
    from ..models.runner import Span, forward_spans

    if end <= start:
        return
    seed = min(end, SEED_ROWS)
    if start < seed:
        vocab = model.embed_tokens.weight.shape[0]
        forward_spans(model, [Span(kv, start, [(i * 31 + 7) % vocab for i in range(start, seed)], "none")])
        start = seed
    if end > start:
        idx = torch.arange(start, end, device=kv.k.device) % seed
        for t, base in kv.tensors():            # a fresh windowed cache's local span starts at 0 too
            t[:, :, start - base:end - base] = t[:, :, idx - base]
        kv.length = end


def large_row_points(k_max: int, max_rows: int) -> list[int]:
    """Row counts measured past k_max + 1, up to a full batch of drafts (max_num_seqs x (k_max + 1))."""
    pts, n = [], k_max + 2
    while n < max_rows:
        n = max(n, round(n * 1.5))
        pts.append(min(n, max_rows))
        n += 1
    return sorted(set(pts))


def head_times(proposer, hidden_size: int, vocab: int, dtype, device, context: int, k: int,
                repeats: int, before=None) -> tuple[float, float]:
    """Seconds a learned head's proposer takes for its first draft token and for each further one, as the engine
    drives it: the target's states of the newest row handed over, then one proposal, after `context` rows.

    before(): run (untimed) ahead of each timed proposal. In the engine every proposal follows a target forward,
    which evicts the head's weights from the caches; `measure_cost_model` and `python -m specdec.bench.heads` pass
    one (`one_target_step`), so the head is timed as it runs there (back to back, proposals find the weights
    cached: a lower bound)."""
    from ..proposers.base import ProposalContext
    from ..sampling_params import SamplingParams

    seq_id, params = -12345, SamplingParams(temperature=0.0)
    states = lambda n: {i: torch.zeros(n, hidden_size, dtype=dtype, device=device)   # noqa: E731
                        for i in proposer.target_hidden}
    ids = [(i * 31 + 7) % vocab for i in range(context + 1)]
    proposer.accept_hidden(seq_id, 0, states(context))
    proposer.propose([ProposalContext(seq_id, list(ids), params, None)], [1])    # the prompt's rows: not timed
    best = {1: float("inf"), k: float("inf")}
    try:
        for i in range(repeats + 1):
            for n in (1, k):
                proposer.accept_hidden(seq_id, len(ids) - 1, states(1))
                ids.append(7 % vocab)
                if before is not None:
                    before()
                t0 = time.perf_counter()
                proposer.propose([ProposalContext(seq_id, list(ids), params, None)], [n])
                if i:
                    best[n] = min(best[n], time.perf_counter() - t0)
    finally:
        proposer.release(seq_id)
    return best[1], max(0.0, (best[k] - best[1]) / max(k - 1, 1))


CONTEXT_BUCKETS = (1024, 2048, 4096)    # contexts measured past the short one (those the model's window holds)
READ_CHUNK = 512     # tokens per forward when the draft reads a prompt (the engine's prefill chunk)
READ_LONG = 2048     # the longer prompt the draft's read is timed on, beside one chunk


def forward_times_by_context(model, ns: list[int], contexts: list[int], repeats: int) -> dict[int, dict[int, float]]:
    """{context: forward_times(...) at that context} for ascending contexts, on one cache that a prefill extends
    from one context to the next (so the longest prompt is read once, not once per context)."""
    top = model.config.max_position_embeddings - max(ns) - 2           # where the model's positions end
    contexts = sorted({min(c, top) for c in contexts})
    kv, done = _primed_cache(model, 0, contexts[-1] + max(ns))
    out = {}
    for c in contexts:
        _extend(model, kv, done, c)
        done = c
        out[c] = _time_rows(model, kv, ns, c, repeats)
    return out


@torch.inference_mode()
def measure_cost_model(target, draft=None, lookup=None, k_max: int = 8, context: int = 256,
                       repeats: int = 5, max_rows: int = 0, heads: dict | None = None,
                       contexts: tuple[int, ...] = CONTEXT_BUCKETS) -> CostModel:
    """target/draft: Transformer models; lookup(token_ids) -> proposal, the n-gram proposer's search; heads: the
    engine's learned-head proposers by method.

    V(n) = t(n) / t(1) for n = 1..k_max+1 and at a few row counts up to `max_rows` (a batched step);
    c = draft step / target step; lookup cost / target step; per head, its first and each further draft token
    / target step. V(n) for n = 1..k_max+1 and c again after each of `contexts` cached tokens (those past `context`
    that the model's positions hold).
    """
    small = list(range(1, k_max + 2))
    t = forward_times(target, small, context, repeats)
    verify = [t[n] / t[1] for n in small]
    big = large_row_points(k_max, max_rows)
    large = [[n, x / t[1]] for n, x in forward_times(target, big, context, max(2, repeats // 2)).items()] if big else []
    c = forward_times(draft, [1], context, repeats)[1] / t[1] if draft is not None else float("inf")
    cost = _lookup_time(lookup, context) / t[1] if lookup is not None else 0.0
    w = target.embed_tokens.weight
    head_cost = {}
    if heads:
        target_step = one_target_step(target, context)
        head_cost = {m: [x / t[1] for x in head_times(p, target.config.hidden_size, w.shape[0], w.dtype, w.device,
                                                        context, min(k_max, 4), repeats, target_step)]
                     for m, p in heads.items()}
    window = target.config.max_position_embeddings - k_max - 4
    longer = sorted({min(x, window) for x in contexts if min(x, window) > context})
    by_context = []
    if longer:
        tl = forward_times_by_context(target, small, longer, max(2, repeats // 2))
        dl = forward_times_by_context(draft, [1], longer, max(2, repeats // 2)) if draft is not None else {}
        for n_ctx, times in tl.items():
            by_context.append({"context": n_ctx, "verify": [times[n] / times[1] for n in small],
                               "draft_step": dl[n_ctx][1] / times[1] if n_ctx in dl else float("inf"),
                               "target_step_s": times[1]})
    # the draft's read of a prompt of one engine chunk and of four (a long prompt's tokens attend to more before them)
    if draft is not None:
        long = max(READ_CHUNK, min(READ_LONG, window, draft.config.max_position_embeddings - 8))
        reads = [[n, prefill_time(draft, n) / n] for n in sorted({READ_CHUNK, long})]
    else:
        reads = []
    return CostModel(draft_step=c, verify=verify, verify_large=large, lookup=cost, target_step_s=t[1],
                     source="measured", heads=head_cost, context=context, by_context=by_context,
                     draft_prefill_s=reads[0][1] if reads else 0.0, draft_read=reads)


def prefill_time(model, tokens: int, repeats: int = 2, chunk: int = READ_CHUNK) -> float:
    """Seconds for `model` to read a `tokens`-token prompt in chunks of `chunk` tokens, as the engine reads one (the
    minimum of a few): a real forward over every token (_primed_cache computes only SEED_ROWS of them, which made a
    512-token read look 3x cheaper than the engine's)."""
    from ..models.runner import Span, forward_spans

    vocab = model.embed_tokens.weight.shape[0]
    ids = [(i * 31 + 7) % vocab for i in range(tokens)]
    best = float("inf")
    for _ in range(repeats):
        kv = model.new_kv()
        kv.resize(-(-(tokens + 1) // model.key_block) * model.key_block)
        t0 = time.perf_counter()
        for start in range(0, tokens, chunk):
            forward_spans(model, [Span(kv, start, ids[start: start + chunk], "none")])
        best = min(best, time.perf_counter() - t0)
    return best


def one_target_step(model, context: int):
    """A function that runs one decode forward of the target after `context` cached rows (its result unused)."""
    from ..models.runner import Span, forward_spans

    kv, context = _primed_cache(model, context, 1)
    return lambda: forward_spans(model, [Span(kv, context, [3 % model.embed_tokens.weight.shape[0]], "last",
                                              decode=True)])


def _lookup_time(lookup, context: int) -> float:
    tokens = [(i * 7919) % 997 for i in range(context * 4)]      # few repeats: the search runs to its end
    t0 = time.perf_counter()
    for _ in range(20):
        lookup(tokens)
    return (time.perf_counter() - t0) / 20


def plausible(cost: CostModel) -> bool:
    """What a quiet machine's measurement satisfies and a disturbed one often breaks: a forward over more rows never
    costs less than over one, and a step after a longer context never costs less than after a shorter one (10%
    allowed for timer noise). A burst of load from elsewhere during the one-row samples breaks the first (V(2) of
    0.66 was seen with four servers starting beside the measurement), during a long context's samples the second."""
    tol = 0.9
    if any(v < tol for b in cost.by_context for v in b["verify"]):     # (CostModel keeps the short context's V >= 1)
        return False
    steps = [cost.target_step_s] + [b["target_step_s"] for b in cost.by_context]
    drafts = [cost.draft_step * cost.target_step_s] + [b["draft_step"] * b["target_step_s"] for b in cost.by_context]
    rising = lambda xs: all(b >= tol * a for a, b in zip(xs, xs[1:]) if math.isfinite(a) and math.isfinite(b))  # noqa: E731
    return rising(steps) and rising(drafts)


# a forward shorter than this is timed mostly as Python's overhead (the tiny test models): its ratios are noise
# whatever the machine does, and waiting for a quiet machine would not make them mean more
NOISE_STEP_S = 0.002


def measure_quietly(measure, attempts: int = 3, wait_s: float = 60.0) -> tuple[CostModel, bool]:
    """measure() -> CostModel; measured again (up to `attempts` in all, each after waiting up to `wait_s` for other
    processes to quiet down) while other processes disturbed it or what it gave is not plausible -> (cost model,
    whether it is clean). An unclean one is for this run only: the caller does not keep it."""
    from .quiet import ForeignLoad, wait_for_quiet

    for attempt in range(attempts):
        if attempt:
            wait_for_quiet(wait_s)
        with ForeignLoad() as load:
            cost = measure()
        if cost.target_step_s < NOISE_STEP_S or (load.quiet and plausible(cost)):
            return cost, True
    return cost, False
