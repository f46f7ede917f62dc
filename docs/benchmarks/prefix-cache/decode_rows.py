"""Are a generated token's K/V the same when computed by a decode step and when recomputed as a prompt row?

Run: .venv/bin/python docs/benchmarks/prefix-cache/decode_rows.py (the int4 target, 2 cores). Prints the prefill time
of a 900-token prompt with prompt rows on flash attention (decode=False: what runs today) and on the row-by-row
attention decode rows use (decode=True), then the largest difference between the K/V of 64 tokens computed as
one-token decode steps and the same tokens recomputed as prompt rows under each attention.
"""
import time

from specdec.models.loader import load_model
from specdec.models.runner import Span, forward_spans

P, G = 900, 64
lm = load_model("qwen2.5-coder-1.5b-instruct", dtype="bfloat16", device="cpu", progress=False, quantization="int4")
m = lm.model
ids = lm.tokenizer.encode(open("specdec/bench/datasets.py").read()[:6000])[:P + G]


def new_kv():
    kv = m.new_kv()
    kv.resize(2048)
    return kv


def prefill(kv, tokens, start, decode, chunk=512):
    for a in range(0, len(tokens), chunk):
        forward_spans(m, [Span(kv, start + a, tokens[a:a + chunk], "last", decode=decode)])
    kv.length = start + len(tokens)


def copy_prefix(src):
    kv = new_kv()
    kv.k[:, :, :P] = src.k[:, :, :P]
    kv.v[:, :, :P] = src.v[:, :, :P]
    return kv


for decode in (False, True, False, True):
    t = time.perf_counter()
    prefill(new_kv(), ids[:P], 0, decode)
    print(f"prefill {P} tokens decode={decode}: {time.perf_counter() - t:.2f} s")
base = new_kv()
prefill(base, ids[:P], 0, False)
steps = copy_prefix(base)
for i in range(P, P + G):                           # one-token decode steps, as generation computes them
    forward_spans(m, [Span(steps, i, [ids[i]], "last", decode=True)])
for decode in (False, True):
    rows = copy_prefix(base)
    prefill(rows, ids[P:P + G], P, decode)          # the same tokens as a prompt chunk (a next turn's prefill)
    dk = (rows.k[:, :, P:P + G].float() - steps.k[:, :, P:P + G].float()).abs().max().item()
    dv = (rows.v[:, :, P:P + G].float() - steps.v[:, :, P:P + G].float()).abs().max().item()
    print(f"generated tokens' K/V as prompt rows (decode attention={decode}) vs decode steps: "
          f"max |dK| {dk} |dV| {dv}")
