"""The draft's one-token step (int4, head cut to 32768 rows, as `specdec serve` loads it) at a context: its whole
forward against the compiled decoder layers in it (csrc/stack.cpp); the rest is the embedding, the final norm, the
output head and the Python around them. With csrc/stack.cpp patched by stack-timers.patch (and the extension rebuilt
with `python setup.py build_ext --inplace --force`), the layers' time is also printed per kind of call.

    python docs/benchmarks/draft-bits/step_split.py SECONDS CONTEXT [MLP_BITS]     # MLP_BITS 3: --draft-mlp-bits 3
"""
import sys
import time

import torch

from specdec.models import fused_stack, qwen2
from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans
from specdec.policy.measure import _primed_cache
from specdec.proposers.draft_vocab import draft_output_ids

torch.set_num_threads(2)
seconds, context = float(sys.argv[1]), int(sys.argv[2])
mlp_bits = int(sys.argv[3]) if len(sys.argv) > 3 else 4
draft = load_model("qwen2.5-coder-0.5b-instruct", quantization="int4", progress=False, int4_exact=False,
                   output_ids=draft_output_ids("qwen2.5-coder-1.5b-instruct", 32768, 151665), mlp_bits=mlp_bits).model
kv, context = _primed_cache(draft, context, 2)
in_stack = [0.0]
run_stack = fused_stack.run_stack


def timed(*args, **kwargs):
    t = time.perf_counter()
    out = run_stack(*args, **kwargs)
    in_stack[0] += time.perf_counter() - t
    return out


qwen2.fused_stack.run_stack = timed
for _ in range(20):
    forward_spans(draft, [Span(kv, context, [5], "last", decode=True)])
in_stack[0], n, t0 = 0.0, 0, time.time()
while time.time() - t0 < seconds:
    forward_spans(draft, [Span(kv, context, [5], "last", decode=True)])
    n += 1
step, layers = (time.time() - t0) / n * 1e3, in_stack[0] / n * 1e3
print(f"MLP at {mlp_bits} bits, context {context}: step {step:.2f} ms, layers {layers:.2f}, rest {step - layers:.2f}")
