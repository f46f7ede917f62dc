"""Where a decode step's time goes beyond the target's forward, in one `LLM` (the default target and draft): each
engine step split into schedule + propose (the draft's chain), the target's forward (ModelRunner.execute), verify
(sampling every row) and commit + the rest, for plain decoding and for the fixed draft at k = 4, interleaved request
by request. Prints each part's median milliseconds per step and per mode.

    .venv/bin/python docs/benchmarks/step-overhead/split.py [ROUNDS] [MAX_TOKENS]
"""
from __future__ import annotations

import statistics
import sys
import time

from specdec import LLM, SamplingParams
from specdec.config import SpeculativeConfig
import specdec.engine.llm_engine as engine_mod

PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests.",
    "Explain in a few paragraphs how a hash map handles collisions, and compare open addressing with chaining.",
]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 96
    llm = LLM(speculative=SpeculativeConfig(method="draft", num_speculative_tokens=4), enable_prefix_caching=False,
              progress=False)
    eng = llm.engine
    marks: dict[str, float] = {}
    parts: list[dict] = []
    real_propose, real_execute, real_verify = eng.drafting.propose, eng.runner.execute, engine_mod.verify_step

    def propose(*a, **kw):
        out = real_propose(*a, **kw)
        marks["proposed"] = time.perf_counter()
        return out

    def execute(*a, **kw):
        t = time.perf_counter()
        out = real_execute(*a, **kw)
        marks["forward"] = time.perf_counter() - t
        marks["rows"] = out.num_rows
        return out

    def verify(*a, **kw):
        t = time.perf_counter()
        out = real_verify(*a, **kw)
        marks["verify"] = time.perf_counter() - t
        return out

    real_step = eng._step

    def step():
        marks.clear()
        t0 = time.perf_counter()
        out = real_step()
        total = time.perf_counter() - t0
        if "verify" in marks and marks.get("rows", 0) and "proposed" in marks:
            parts.append({"rows": marks["rows"], "total": total, "forward": marks["forward"],
                          "propose": marks["proposed"] - t0, "verify": marks["verify"]})
        return out

    eng.drafting.propose, eng.runner.execute, engine_mod.verify_step, eng._step = propose, execute, verify, step
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0)
    by_mode: dict[str, list[dict]] = {"none": [], "draft": []}
    llm.generate(PROMPTS[0], SamplingParams(max_tokens=8, temperature=0), spec="none")      # warm-up
    for r in range(rounds):
        for p in PROMPTS:
            for mode in (("none", "draft") if r % 2 == 0 else ("draft", "none")):
                spec = "none" if mode == "none" else SpeculativeConfig(method="draft", num_speculative_tokens=4)
                parts.clear()
                llm.generate(p, greedy, spec=spec)
                by_mode[mode] += [x for x in parts[1:]]          # the first: the prompt's chunk
    for mode, xs in by_mode.items():
        med = {k: 1000 * statistics.median(x[k] for x in xs) for k in ("total", "propose", "forward", "verify")}
        rest = statistics.median(1000 * (x["total"] - x["propose"] - x["forward"] - x["verify"]) for x in xs)
        print(f"{mode}: {len(xs)} steps, rows {statistics.median(x['rows'] for x in xs)}: step {med['total']:.1f} ms = "
              f"schedule+propose {med['propose']:.1f} + forward {med['forward']:.1f} + verify {med['verify']:.2f} "
              f"+ commit and the rest {rest:.2f}")


if __name__ == "__main__":
    main()
