"""One-token steps of the int4 target and the 0.5B draft (its head cut to 32768 rows, as `specdec serve` loads it),
their layers run by the compiled stack (csrc/stack.cpp) against the same layers run by the modules, interleaved
step by step in one process; median ms per context, and the draft's step over the target's for each.

    .venv/bin/python docs/benchmarks/fused-stack/step.py [--contexts 256,1024,2048] [--steps 40]
"""
import argparse
import statistics
import time

import torch

from specdec.models import fused_stack
from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans
from specdec.policy.measure import _primed_cache
from specdec.proposers.draft_vocab import draft_output_ids

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
ap = argparse.ArgumentParser()
ap.add_argument("--contexts", default="256,1024,2048")
ap.add_argument("--steps", type=int, default=40)
args = ap.parse_args()
torch.set_num_threads(2)
target = load_model(TARGET, quantization="int4", progress=False)
draft = load_model(DRAFT, quantization="int4", progress=False, int4_exact=False,
                   output_ids=draft_output_ids(TARGET, 32768, target.tokenizer.vocab_size))
models = {"target": target.model, "draft": draft.model}
stack_on = fused_stack.runs_stack
modes = {"stack": stack_on, "modules": lambda: False}
for ctx in map(int, args.contexts.split(",")):
    caches = {name: _primed_cache(m, ctx, 2) for name, m in models.items()}
    times = {(name, mode): [] for name in models for mode in modes}
    for _ in range(args.steps):
        for name, m in models.items():
            kv, c = caches[name]
            for mode, runs in modes.items():
                fused_stack.runs_stack = runs
                t = time.perf_counter()
                forward_spans(m, [Span(kv, c, [5], "last", decode=True)])
                times[name, mode].append(time.perf_counter() - t)
    fused_stack.runs_stack = stack_on
    med = {key: statistics.median(v[3:]) * 1e3 for key, v in times.items()}
    print(f"context {ctx}: " + ", ".join(f"{n} {mode} {med[n, mode]:.2f} ms" for n in models for mode in modes)
          + "; draft / target: " + ", ".join(f"{mode} {med['draft', mode] / med['target', mode]:.3f}"
                                             for mode in modes), flush=True)
