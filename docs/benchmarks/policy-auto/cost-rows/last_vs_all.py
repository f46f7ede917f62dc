"""What a verification forward costs with logits for every row (as the engine verifies) against the last row's only
(as the cost model timed it up to revision 18), and with none: interleaved, after 256 tokens of context.

    .venv/bin/python docs/benchmarks/policy-auto/cost-rows/last_vs_all.py
"""
import statistics
import time

import torch

from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans
from specdec.policy.measure import _primed_cache

torch.set_num_threads(2)
tgt = load_model("qwen2.5-coder-1.5b-instruct", quantization="int4", progress=False).model
kv, c = _primed_cache(tgt, 256, 10)
cases = [(1, "last"), (5, "last"), (5, "all"), (9, "last"), (9, "all"), (5, "none")]
times = {x: [] for x in cases}
for _ in range(12):
    for n, mode in cases:
        t = time.perf_counter()
        forward_spans(tgt, [Span(kv, c, [(j * 17 + 3) % 1000 for j in range(n)], mode, decode=True)])
        times[(n, mode)].append(time.perf_counter() - t)
base = statistics.median(times[(1, "last")][2:])
for x, v in times.items():
    m = statistics.median(v[2:])
    print(x, f"{m * 1e3:.2f} ms  V={m / base:.3f}  min {min(v) * 1e3:.2f}")
