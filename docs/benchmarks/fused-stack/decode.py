"""Plain decoding (speculation off) and `auto` of `LLM()` with its defaults, the int4 layers run by the compiled stack
against the modules, alternating request by request in one process: decode tok/s of each request.

    .venv/bin/python docs/benchmarks/fused-stack/decode.py [--rounds 3] [--max-tokens 96]
"""
import argparse
import statistics

from specdec import LLM, SamplingParams
from specdec.models import fused_stack

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--max-tokens", type=int, default=96)
args = ap.parse_args()
llm = LLM()
stack_on = fused_stack.runs_stack
params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
prompt = "Write a Python function that parses a CSV file and returns the rows as dictionaries."
rates = {(spec, mode): [] for spec in ("none", "auto") for mode in ("stack", "modules")}
texts = {}
for _ in range(args.rounds):
    for spec, mode in rates:
        fused_stack.runs_stack = stack_on if mode == "stack" else (lambda: False)
        out = llm.generate(prompt, params, spec=spec)[0]
        rates[spec, mode].append((len(out.token_ids) - 1) / (out.stats.e2e_s - out.stats.ttft_s))
        texts.setdefault(spec, set()).add(tuple(out.token_ids))
fused_stack.runs_stack = stack_on
for (spec, mode), r in rates.items():
    print(f"{spec:5s} {mode:8s} decode tok/s {' '.join(f'{x:.2f}' for x in r)}  median {statistics.median(r):.2f}")
for spec in ("none", "auto"):
    print(f"{spec}: stack / modules {statistics.median(rates[spec, 'stack']) / statistics.median(rates[spec, 'modules']):.3f}")
print("greedy outputs identical across modes and methods:", len({t for s in texts.values() for t in s}) == 1)
