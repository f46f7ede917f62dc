"""The two built-in open prompts through the fixed draft at k = 4 and 8 and through auto (each in a pool of its own),
draft_p_min at its default, two rounds, each request on an idle machine: does auto lose to the draft on open prose,
and does the room of 8 cost anything there?

    python docs/benchmarks/draft-confidence/prose_trace.py
"""
import json

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle
from specdec.config import SpeculativeConfig

llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
llm.policy()
prompts = [p for p in load_prompts("builtin") if p.get("category") == "open-ended"]
params = SamplingParams(max_tokens=128, temperature=0.0)
variants = {"draft4": SpeculativeConfig(method="draft", num_speculative_tokens=4),
            "draft8": SpeculativeConfig(method="draft", num_speculative_tokens=8),
            "auto": SpeculativeConfig(method="auto")}
llm.generate(llm.encode(prompts[0]["messages"]), SamplingParams(max_tokens=4, temperature=0), spec="draft")
for r in range(2):
    for pi, p in enumerate(prompts):
        ids = llm.encode(p["messages"])
        for name, spec in variants.items():
            wait_until_idle()
            o = llm.generate(ids, params, spec=spec, pool=f"{name}", cache_salt=f"{name}{r}")[0]
            s = o.stats
            print(json.dumps({"r": r, "p": pi, "v": name, "dec": round(s.decode_tok_s, 2), "fw": s.target_forwards,
                              "dsteps": s.draft_steps, "dtok": s.draft_tokens, "acc": s.accepted_tokens,
                              "lsteps": s.lookup_steps, "m": s.method}), flush=True)
