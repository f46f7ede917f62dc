"""Prompt time (first token) of ~1k-token prompts on the default target, speculation off, with the AMX kernel for
prompt chunks (the default where the CPU has AMX-INT8) against the AVX-512 VNNI kernel alone, interleaved: round r
sends prompt r to each kernel in turn, each prompt new to the prefix cache (a distinct first line).

    .venv/bin/python docs/benchmarks/amx/ttft.py [--rounds 3] [--words 700]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from specdec import LLM, SamplingParams
from specdec.models.quantization.kernels import load_kernels

PROMPT = pathlib.Path(__file__).parents[1] / "ttft-2k" / "prompt.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--words", type=int, default=700, help="words of the long prompt kept (~1.5 tokens each)")
    args = ap.parse_args()
    C = load_kernels()
    if not C.has_amx():
        raise SystemExit("this CPU (or its Linux) does not run AMX-INT8: nothing to compare")
    default_rows = C.amx_min_rows()
    llm = LLM(speculative="none")
    text = " ".join(json.loads(PROMPT.read_text().splitlines()[0])["messages"][0]["content"].split()[: args.words])
    greedy = SamplingParams(max_tokens=1, temperature=0)
    llm.generate("warm-up " + text[:400], greedy)
    times: dict[str, list[float]] = {"vnni": [], "amx": []}
    for r in range(args.rounds):
        for kernel in times:
            C.set_amx_min_rows(10**9 if kernel == "vnni" else default_rows)
            t0 = time.perf_counter()
            out = llm.generate(f"[round {r}, {kernel}]\n" + text, greedy)[0]
            times[kernel].append(time.perf_counter() - t0)
            print(f"round {r} {kernel}: {len(out.prompt_token_ids)} prompt tokens, {times[kernel][-1]:.2f} s",
                  flush=True)
    C.set_amx_min_rows(default_rows)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median s: vnni {med['vnni']:.2f}, amx {med['amx']:.2f}; vnni / amx {med['vnni'] / med['amx']:.2f}x "
          f"(per round {', '.join(f'{a / b:.2f}' for a, b in zip(times['vnni'], times['amx']))})")


if __name__ == "__main__":
    main()
