"""Paired A/B of the AMX kernel's variants in one process (needs switch.diff applied): the 1.5B's layer stack (no
output head) at M rows, the variant switched per forward. python variant_ab.py REPS M LAYERS [q6]"""
import statistics
import sys
import time

import torch

from specdec.bench.kernels import LAYER_SHAPES, _ours_impl
from specdec.models.quantization.kernels import load_kernels

ext = load_kernels()
reps, M = int(sys.argv[1]), int(sys.argv[2])
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 28
fmt = {} if len(sys.argv) <= 4 else dict(bits=6, group=16, sb=16)
shapes = LAYER_SHAPES * layers
lins = [_ours_impl("amx", **fmt)(n, k) for n, k in shapes]
xs = {k: torch.randn(M, k, dtype=torch.bfloat16) for k in {k for _, k in shapes}}
t = {0: [], 1: [], 2: []}
with torch.inference_mode():
    for rep in range(reps + 1):
        order = [0, 1, 2] if rep % 2 == 0 else [2, 1, 0]
        for v in order:
            ext.set_amx_variant(v)
            t0 = time.perf_counter()
            for (_, k), lin in zip(shapes, lins):
                lin(xs[k])
            if rep:
                t[v].append(time.perf_counter() - t0)
for v in (1, 2):
    r = [a / b for a, b in zip(t[v], t[0])]
    print(f"variant {v} / 0: median {statistics.median(r):.3f} [{min(r):.3f}-{max(r):.3f}]  "
          f"min ms {1000*min(t[v]):.0f} vs {1000*min(t[0]):.0f}")
