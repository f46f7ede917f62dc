"""What a draft step costs where it runs: right after target forwards (one, five or nine rows, or all of n = 1..9 in
turn, as the cost model's rounds time them), and the step after it, against a draft step after a draft step. The
draft loads as `specdec serve` loads it (int4, head cut to 32768 rows). Medians over the timed rounds, in ms.

    python docs/benchmarks/draft-bits/chain_steps.py [CONTEXT] [ROUNDS]
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
context = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
target = load_model(TARGET, quantization="int4", progress=False).model
draft = load_model(DRAFT, quantization="int4", progress=False, int4_exact=False,
                   output_ids=draft_output_ids(TARGET, 32768, 151665)).model
t_kv, t_ctx = _primed_cache(target, context, 10)
d_kv, d_ctx = _primed_cache(draft, context, 2)


def ms(model, kv, ctx, rows, logits):
    t0 = time.perf_counter()
    forward_spans(model, [Span(kv, ctx, [(j * 17 + 3) for j in range(rows)], logits, decode=True)])
    return (time.perf_counter() - t0) * 1e3


before = {"target 1 row": [1], "target 5 rows": [5], "target 9 rows": [9], "target 1..9 rows": list(range(1, 10)),
          "a draft step": []}
times = {name: [] for name in before}
for r in range(rounds + 1):                      # the first round warms up
    for name, rows in before.items():
        for n in rows:
            ms(target, t_kv, t_ctx, n, "all")
        if not rows:
            ms(draft, d_kv, d_ctx, 1, "last")
        first, second = ms(draft, d_kv, d_ctx, 1, "last"), ms(draft, d_kv, d_ctx, 1, "last")
        if r:
            times[name].append((first, second))
print(f"context {context}, {rounds} rounds: draft step (ms) right after ..., and the step after it")
for name, pairs in times.items():
    first, second = (statistics.median(p[i] for p in pairs) for i in (0, 1))
    print(f"  {name:18s} first {first:6.2f}  next {second:6.2f}  first / next {first / second:.3f}")
