"""First token of a long prompt (the default target, speculation off) with the AMX kernel's variant 0 and 1 in turn,
one process (needs switch.diff applied). python prompt_variant.py ROUNDS WORDS (from the checkout's root)"""
import json
import pathlib
import statistics
import sys
import time

from specdec import LLM, SamplingParams
from specdec.models.quantization.kernels import load_kernels

ext = load_kernels()
PROMPT = pathlib.Path("docs/benchmarks/ttft-2k/prompt.jsonl")
llm = LLM(speculative="none", progress=False)
words = json.loads(PROMPT.read_text().splitlines()[0])["messages"][0]["content"].split()
greedy = SamplingParams(max_tokens=1, temperature=0)
llm.generate("warm-up " + " ".join(words[:300]), greedy)
n = int(sys.argv[2])
t = {0: [], 1: []}
for r in range(int(sys.argv[1])):
    for v in ((0, 1) if r % 2 == 0 else (1, 0)):
        ext.set_amx_variant(v)
        t0 = time.perf_counter()
        out = llm.generate(f"[repeat {r} {v}]\n" + " ".join(words[:n]), greedy)[0]
        t[v].append(time.perf_counter() - t0)
ratios = [a / b for a, b in zip(t[1], t[0])]
print(len(out.prompt_token_ids), "tokens; chunked / before: median %.3f [%.3f-%.3f]; s before %s; after %s" % (
    statistics.median(ratios), min(ratios), max(ratios), [round(x, 2) for x in t[0]], [round(x, 2) for x in t[1]]))
