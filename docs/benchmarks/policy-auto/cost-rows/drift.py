"""The int4 target's forward over 1 row and over 5 rows (every row's logits), interleaved for 150 s: each line the
medians of 5 s, to see whether the machine's speed drifts and which forwards it moves.

    .venv/bin/python docs/benchmarks/policy-auto/cost-rows/drift.py
"""
import statistics
import time

import torch

from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans
from specdec.policy.measure import _primed_cache

torch.set_num_threads(2)
tgt = load_model("qwen2.5-coder-1.5b-instruct", quantization="int4", progress=False).model
kv, c = _primed_cache(tgt, 256, 6)


def forward(n: int) -> float:
    t = time.perf_counter()
    forward_spans(tgt, [Span(kv, c, [(j * 17 + 3) % 1000 for j in range(n)], "all", decode=True)])
    return time.perf_counter() - t


t_end = time.time() + 150
while time.time() < t_end:
    one, five = [], []
    t0 = time.time()
    while time.time() - t0 < 5:
        one.append(forward(1))
        five.append(forward(5))
    m1, m5 = statistics.median(one), statistics.median(five)
    print(f"{time.strftime('%H:%M:%S')} t1 {m1 * 1e3:.1f} ms  t5 {m5 * 1e3:.1f} ms  V5 {m5 / m1:.2f}", flush=True)
