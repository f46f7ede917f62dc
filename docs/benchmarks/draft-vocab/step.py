"""The 0.5B draft's one-token step against the int4 target's, by context, with its output head whole and cut to N rows
of the target's ranking (interleaved rounds in one process, median ms; ratio = draft / target).

    .venv/bin/python docs/benchmarks/draft-vocab/step.py [0,65536,32768,16384,8192]
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
sizes = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "0,65536,32768,16384,8192").split(",")]
tgt = load_model(TARGET, quantization="int4", progress=False)
models = [("target", tgt.model)] + [
    (f"draft-{n or 'whole'}", load_model(DRAFT, quantization="int4", progress=False, int4_exact=False,
                                         output_ids=draft_output_ids(TARGET, n, tgt.tokenizer.vocab_size)).model)
    for n in sizes]
for ctx in (256, 1024, 2048, 4096):
    caches = {name: _primed_cache(m, ctx, 2) for name, m in models}
    times = {name: [] for name, _ in models}
    for _ in range(25):
        for name, m in models:
            kv, c = caches[name]
            t = time.perf_counter()
            forward_spans(m, [Span(kv, c, [5], "last", decode=True)])
            times[name].append(time.perf_counter() - t)
    med = {name: statistics.median(v[3:]) * 1e3 for name, v in times.items()}
    print(f"context {ctx}: " + ", ".join(f"{name} {v:.2f} ms ({v / med['target']:.3f})" for name, v in med.items()),
          flush=True)
