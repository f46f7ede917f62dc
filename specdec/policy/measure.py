"""Measure the cost model on this machine: a target forward over n = 1..K+1 tokens, one draft step, one n-gram
lookup, at a realistic context length, in a few interleaved timed rounds after a warm-up: a ratio (V(n), the draft
step's c) is the median of each round's own ratio, an absolute time the fastest round's.
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
    return _fastest(_time_rounds(model, kv, ns, context, repeats), ns)


def _fastest(rounds: list[dict], keys) -> dict:
    return {n: min(r[n] for r in rounds) for n in keys}


# Draft steps timed together, after the target's forwards: c prices each step of a chain (k of them), and a lone step
# right after the round's nine target forwards cost 6% more than the next on the Intel AMX machine (11.50 against
# 10.84 ms at 1k; 2% after one verification forward, as the proposer runs), so a lone sample priced every step of a
# chain at its first one's cost (docs/benchmarks/draft-bits, "The draft's step as a chain runs it")
DRAFT_CHAIN = 4


def _time_rounds(model, kv, ns: list[int], context: int, repeats: int, draft=None) -> list[dict]:
    """`repeats` timed rounds (after one warm-up), each {n: seconds of a forward over n rows after `context` cached
    ones} for every n in ns, with logits for every row, as a verification computes them (the output head over each
    row is part of what a row costs); with draft = (model, kv, context), also "draft_step": a draft step (one row, its
    newest row's logits, as the draft proposer runs it), the mean of a chain of DRAFT_CHAIN right after the target's
    forwards of the same round, as the proposer runs one after a verification."""
    from ..models.runner import Span, forward_spans

    device = model.embed_tokens.weight.device
    vocab = model.embed_tokens.weight.shape[0]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(m, span) -> float:
        sync()
        t0 = time.perf_counter()
        forward_spans(m, [span])
        sync()
        return time.perf_counter() - t0

    rounds = []
    for i in range(repeats + 1):
        r = {n: timed(model, Span(kv, context, [(j * 17 + 3) % vocab for j in range(n)], "all", decode=True))
             for n in ns}
        if draft is not None:
            d_model, d_kv, d_context = draft
            token = 3 % d_model.embed_tokens.weight.shape[0]
            r["draft_step"] = sum(timed(d_model, Span(d_kv, d_context, [token], "last", decode=True))
                                  for _ in range(DRAFT_CHAIN)) / DRAFT_CHAIN
        if i:                                     # the first round is a warm-up
            rounds.append(r)
    return rounds


def ratios(rounds: list[dict], ns: list[int]) -> tuple[dict[int, float], float, float]:
    """From interleaved rounds (each with n = 1): V(n), each the median over rounds of t(n) / t(1) of the same
    round, the draft step over the target's the same way (inf without one), and the quiet machine's t(1) (the
    fastest). A ratio of samples taken a few milliseconds apart stays right where the machine's speed drifts between
    rounds (a 2-core cloud machine was seen to step its one-row forward between 25 and 35 ms from minute to minute,
    while a forward over 5 rows moved far less): a ratio of each one's fastest round mixes two states."""
    import statistics

    v = {n: statistics.median(r[n] / r[1] for r in rounds) for n in ns}
    c = statistics.median(r["draft_step"] / r[1] for r in rounds) if "draft_step" in rounds[0] else float("inf")
    return v, c, min(r[1] for r in rounds)


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
    return {c: _fastest(r, ns) for c, r in rounds_by_context(model, ns, contexts, repeats).items()}


def rounds_by_context(model, ns: list[int], contexts: list[int], repeats: int, draft=None) -> dict[int, list[dict]]:
    """{context: _time_rounds(...) at that context} for ascending contexts (cut to where the model's positions end),
    each model's cache extended from one context to the next; the draft's step is timed at the contexts its own
    window holds."""
    top = model.config.max_position_embeddings - max(ns) - 2           # where the model's positions end
    contexts = sorted({min(c, top) for c in contexts})
    kv, done = _primed_cache(model, 0, contexts[-1] + max(ns))
    d_top = draft.config.max_position_embeddings - 3 if draft is not None else 0
    d_kv, d_done = _primed_cache(draft, 0, min(contexts[-1], d_top) + 1) if draft is not None else (None, 0)
    out = {}
    for c in contexts:
        _extend(model, kv, done, c)
        done = c
        paired = None
        if draft is not None and c <= d_top:
            _extend(draft, d_kv, d_done, c)
            d_done, paired = c, (draft, d_kv, c)
        out[c] = _time_rounds(model, kv, ns, c, repeats, paired)
    return out


@torch.inference_mode()
def measure_cost_model(target, draft=None, lookup=None, k_max: int = 8, context: int = 256,
                       repeats: int = 5, max_rows: int = 0, heads: dict | None = None,
                       contexts: tuple[int, ...] = CONTEXT_BUCKETS) -> CostModel:
    """target/draft: Transformer models; lookup(token_ids) -> proposal, the n-gram proposer's search; heads: the
    engine's learned-head proposers by method.

    V(n) = t(n) / t(1) for n = 1..k_max+1 and at a few row counts up to `max_rows` (a batched step), every row's
    logits computed as a verification does; c = draft step / target step, timed in the same rounds; lookup cost
    / target step; per head, its first and each further draft token / target step. V(n) for n = 1..k_max+1 and c
    again after each of `contexts` cached tokens (those past `context` that the model's positions hold).
    """
    small = list(range(1, k_max + 2))
    # the draft's step in the same rounds as the target's forwards: c is a ratio of neighbouring samples
    kv, short = _primed_cache(target, context, max(small))
    paired = (draft, *_primed_cache(draft, context, 1)) if draft is not None else None
    v, c, step = ratios(_time_rounds(target, kv, small, short, repeats, paired), small)
    verify = [v[n] for n in small]
    big = large_row_points(k_max, max_rows)
    if big:
        kv, short = _primed_cache(target, context, max(big))
        v_big = ratios(_time_rounds(target, kv, [1, *big], short, max(2, repeats // 2)), [1, *big])[0]
        large = [[n, v_big[n]] for n in big]
    else:
        large = []
    cost = _lookup_time(lookup, context) / step if lookup is not None else 0.0
    w = target.embed_tokens.weight
    head_cost = {}
    if heads:
        target_step = one_target_step(target, context)
        head_cost = {m: [x / step for x in head_times(p, target.config.hidden_size, w.shape[0], w.dtype, w.device,
                                                        context, min(k_max, 4), repeats, target_step)]
                     for m, p in heads.items()}
    window = target.config.max_position_embeddings - k_max - 4
    longer = sorted({min(x, window) for x in contexts if min(x, window) > context})
    by_context = []
    if longer:
        for n_ctx, rounds in rounds_by_context(target, small, longer, max(2, repeats // 2), draft).items():
            v, c_ctx, step_ctx = ratios(rounds, small)
            by_context.append({"context": n_ctx, "verify": [v[n] for n in small], "draft_step": c_ctx,
                               "target_step_s": step_ctx})
    # the draft's read of a prompt of one engine chunk and of four (a long prompt's tokens attend to more before them)
    if draft is not None:
        long = max(READ_CHUNK, min(READ_LONG, window, draft.config.max_position_embeddings - 8))
        reads = [[n, prefill_time(draft, n) / n] for n in sorted({READ_CHUNK, long})]
    else:
        reads = []
    return CostModel(draft_step=c, verify=verify, verify_large=large, lookup=cost, target_step_s=step,
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
