"""First-token time of long prompts in one process (the default target, int4, speculation off): each prompt new to
the prefix cache (a distinct first line). Prints one JSON line {"tokens": [...], "seconds": [...]}.

    .venv/bin/python docs/benchmarks/amx/prompt_time.py [--words 700,1400] [--repeats 2]

Run against another checkout's build with PYTHONPATH=<that checkout> (prompt_ab.sh alternates two builds).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

from specdec import LLM, SamplingParams

PROMPT = pathlib.Path(__file__).resolve().parents[1] / "ttft-2k" / "prompt.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", default="700,1400", help="comma list: words of the long prompt kept (~1.5 tokens each)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    llm = LLM(speculative="none")
    words = json.loads(PROMPT.read_text().splitlines()[0])["messages"][0]["content"].split()
    greedy = SamplingParams(max_tokens=1, temperature=0)
    llm.generate("warm-up " + " ".join(words[:300]), greedy)
    tokens, seconds = [], []
    for r in range(args.repeats):
        for n in (int(w) for w in args.words.split(",")):
            t0 = time.perf_counter()
            out = llm.generate(f"[repeat {r}, {n} words]\n" + " ".join(words[:n]), greedy)[0]
            seconds.append(round(time.perf_counter() - t0, 3))
            tokens.append(len(out.prompt_token_ids))
    print(json.dumps({"tokens": tokens, "seconds": seconds}))


if __name__ == "__main__":
    main()
