"""The draft's one-token step over the target's, with its MLP at 4 and at 3 bits, in the same timed rounds: each
round times the target's step, then each draft's, ~0.5 s each, at one context; the ratio is taken within a round and
the median over rounds reported (this machine's speed drifts by ~20% minute to minute; a ratio within a round does
not). The drafts load as `specdec serve` loads them (int4, head cut to 32768 rows; --draft-mlp-bits 3 for the other).

    python docs/benchmarks/draft-bits/step_ratio.py [ROUNDS] [CONTEXT ...]
"""
import statistics
import sys
import time

import torch

from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans
from specdec.policy.measure import _primed_cache
from specdec.proposers.draft_vocab import draft_output_ids

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
contexts = [int(c) for c in sys.argv[2:]] or [256, 1024, 2048]
target = load_model(TARGET, quantization="int4", progress=False).model
cut = draft_output_ids(TARGET, 32768, 151665)
drafts = {bits: load_model(DRAFT, quantization="int4", progress=False, int4_exact=False, output_ids=cut,
                           mlp_bits=bits).model for bits in (4, 3)}


def step_ms(model, kv, context, seconds=0.5):
    for _ in range(3):
        forward_spans(model, [Span(kv, context, [5], "last", decode=True)])
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        forward_spans(model, [Span(kv, context, [5], "last", decode=True)])
        n += 1
    return (time.perf_counter() - t0) / n * 1e3


for context in contexts:
    caches = {"target": _primed_cache(target, context, 2),
              **{bits: _primed_cache(model, context, 2) for bits, model in drafts.items()}}
    ratios, times = {4: [], 3: []}, {"target": [], 4: [], 3: []}
    for r in range(rounds):
        t = step_ms(target, *caches["target"])
        times["target"].append(t)
        for bits, model in sorted(drafts.items(), reverse=r % 2 == 1):     # each draft first in half the rounds
            d = step_ms(model, *caches[bits])
            times[bits].append(d)
            ratios[bits].append(d / t)
    med = {k: statistics.median(v) for k, v in times.items()}
    each = "; ".join(f"draft MLP {b} bits {med[b]:.2f} ms, c {statistics.median(ratios[b]):.3f} "
                     f"[{min(ratios[b]):.3f}-{max(ratios[b]):.3f}]" for b in (4, 3))
    gain = statistics.median(times[3][i] / times[4][i] for i in range(rounds))
    print(f"context {context}: target {med['target']:.2f} ms; {each}; 3 / 4 bits {gain:.3f} ({rounds} rounds)",
          flush=True)
