"""The 0.5B draft's attention alone: 24 layers of ragged_attention with its shapes (14 query heads, 2 KV heads of 64,
bf16 caches), one decode row (and 5) after each context, as `python -m specdec.bench.attention` times the target's.

    python docs/benchmarks/draft-bits/attention_draft.py [REPS] [IMPL,IMPL...]     # e.g. 9 amx,avx512bf16
"""
import sys

import torch

import specdec.bench.attention as bench

torch.set_num_threads(2)
bench.HQ, bench.HKV, bench.D = 14, 2, 64
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 9
for impl in (sys.argv[2] if len(sys.argv) > 2 else "auto").split(","):
    ms = bench.attention_ms([64, 1024, 2048], [1, 5], reps, impl=impl, layers=24)
    print(impl, "  ".join(f"context {c}, {r} rows: {t:.3f} ms" for (c, r), t in sorted(ms.items())), flush=True)
