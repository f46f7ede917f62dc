"""What the attention's numerics cost in quality: perplexity of the int4 target (as `specdec serve` loads it) on the
long prompts' documents (`long:8`) cut into windows of 513 tokens, each scored from an empty cache with its rows
through the row kernel serving runs (Span.decode=True). Run it in two checkouts to compare their kernels.

    python docs/benchmarks/attention-bf16/perplexity.py
"""
import math

import torch

from specdec.bench.datasets import load_prompts
from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans

torch.set_num_threads(2)
m = load_model("qwen2.5-coder-1.5b-instruct", quantization="int4", progress=False)
model, tok = m.model, m.tokenizer
wins = []
for p in load_prompts("long:8"):
    ids = tok.encode_chat(p["messages"])
    for i in range(0, len(ids) - 513, 513):
        wins.append(ids[i:i + 513])
nll, n = 0.0, 0
for ids in wins:
    kv = model.new_kv()
    kv.resize(-(-(len(ids) + 1) // model.key_block) * model.key_block)
    logits = forward_spans(model, [Span(kv, 0, ids[:-1], "all", decode=True)])[0].float()
    lp = torch.log_softmax(logits, -1)
    tgt = torch.tensor(ids[1:])
    nll -= lp[torch.arange(len(tgt)), tgt].sum().item()
    n += len(tgt)
print(f"{len(wins)} windows, {n} positions: perplexity {math.exp(nll / n):.4f}")
