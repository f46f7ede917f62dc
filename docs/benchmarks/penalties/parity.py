"""Greedy tokens with penalties, logit_bias and min_tokens on the real pair, speculation off against every method the
engine runs (the shipped heads included): they must be identical token for token (issue 59).

    .venv/bin/python docs/benchmarks/penalties/parity.py > docs/benchmarks/penalties/amd-zen4.txt
"""
import platform

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.bench.datasets import load_prompts

llm = LLM(speculative="auto", progress=False)     # as `specdec serve`: the draft and the shipped heads loaded
tok = llm.tokenizer
prompts = [p["messages"] for p in load_prompts("builtin", 0)][:4]
settings = {
    "frequency 0.5": dict(frequency_penalty=0.5),
    "presence 0.8": dict(presence_penalty=0.8),
    "repetition 1.3": dict(repetition_penalty=1.3),
    "bias -100 on ' the', +3 on 'def'": dict(logit_bias={tok.encode(" the")[0]: -100.0, tok.encode("def")[0]: 3.0}),
    "min_tokens 40": dict(min_tokens=40),
    "all together": dict(frequency_penalty=0.3, presence_penalty=0.3, repetition_penalty=1.1, min_tokens=20,
                         logit_bias={tok.encode(" the")[0]: -100.0}),
}
methods = [m for m in ("ngram", "draft", "suffix", "eagle3", "medusa", "hybrid") if llm.engine.runs(m)] + ["auto"]
print(f"machine: {platform.processor() or platform.machine()}; methods: {', '.join(methods)}")
total = same = 0
for name, kw in settings.items():
    row = []
    params = SamplingParams(max_tokens=64, temperature=0.0, **kw)
    plain = [llm.generate(msgs, params, spec="none")[0].token_ids for msgs in prompts]
    for method in methods:
        ok = 0
        for msgs, want in zip(prompts, plain):
            spec = method if method == "auto" else SpeculativeConfig(method=method, num_speculative_tokens=4)
            ok += llm.generate(msgs, params, spec=spec)[0].token_ids == want
        row.append(f"{method} {ok}/{len(prompts)}")
        total, same = total + len(prompts), same + ok
    print(f"{name}: " + ", ".join(row))
print(f"identical to speculation off: {same}/{total}")
