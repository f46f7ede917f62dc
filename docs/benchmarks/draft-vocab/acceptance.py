"""Acceptance and decode speed of the 0.5B draft (k=4, greedy) with its head whole or cut to N rows: each prompt run
plain, then with every head in turn (one process, models loaded once), each against plain decoding of that prompt.

    .venv/bin/python docs/benchmarks/draft-vocab/acceptance.py 0,65536,32768,16384 builtin,humaneval:10 96
"""
import statistics
import sys

import torch

from specdec.bench.datasets import load_prompts
from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine
from specdec.models.loader import load_model
from specdec.proposers.draft_vocab import draft_output_ids
from specdec.sampling_params import SamplingParams

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
torch.set_num_threads(2)
sizes = [int(x) for x in sys.argv[1].split(",")]
prompts = load_prompts(sys.argv[2])
max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 96
tgt = load_model(TARGET, quantization="int4", progress=False)
engines = {}
for n in sizes:
    draft = load_model(DRAFT, quantization="int4", progress=False, int4_exact=False,
                       output_ids=draft_output_ids(TARGET, n, tgt.tokenizer.vocab_size)).model
    engines[n] = LLMEngine(EngineConfig(tgt.model, tgt.tokenizer, draft, enable_prefix_caching=False))
plain = LLMEngine(EngineConfig(tgt.model, tgt.tokenizer, None, enable_prefix_caching=False))


def run(engine, ids, spec):
    seq = engine.add_request("r", ids, SamplingParams(max_tokens=max_tokens, temperature=0.0), spec)
    while engine.has_unfinished():
        engine.step()
    return seq


res = {n: {"accepted": 0, "drafted": 0, "steps": 0, "speedup": [], "same": 0, "by_category": {}} for n in sizes}
for p in prompts:
    ids = tgt.tokenizer.encode_chat(p["messages"])
    ref = run(plain, ids, SpeculativeConfig(method="none"))
    for n in sizes:
        seq = run(engines[n], ids, SpeculativeConfig(method="draft", num_speculative_tokens=4))
        st, r = seq.stats, res[n]
        r["accepted"] += st.accepted_tokens
        r["drafted"] += st.draft_tokens
        r["steps"] += st.draft_steps
        r["speedup"].append(st.decode_tok_s / ref.stats.decode_tok_s)
        r["same"] += seq.output_ids == ref.output_ids
        cat = r["by_category"].setdefault(p["category"], [0, 0])
        cat[0] += st.accepted_tokens
        cat[1] += st.draft_steps
for n in sizes:
    r = res[n]
    print(f"draft_vocab {n or 'whole'}: acceptance {r['accepted'] / r['drafted']:.3f}, accepted per step "
          f"{r['accepted'] / r['steps']:.2f}, decode speedup median {statistics.median(r['speedup']):.3f}, "
          f"identical to plain {r['same']}/{len(prompts)}; accepted per step by category "
          + ", ".join(f"{k} {a / b:.2f}" for k, (a, b) in r["by_category"].items()), flush=True)
