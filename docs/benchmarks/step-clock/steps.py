"""The target's decode steps as the engine runs them, by rows, against the cost model `auto` prices them with.

Times every decode-only forward (`ModelRunner.execute`) and every drafting call of a fresh `LLM` loaded as
`specdec serve` loads it, over built-in prompts of some categories, each method in turn per prompt, ROUNDS times;
then prints the median step by row count, its ratio to the median one-row step (V as the machine runs now), the
cost model's V at the prompts' context, and the draft's time per drafted token against the one-row step (c).

    python docs/benchmarks/step-clock/steps.py CATEGORIES "METHOD[:K];..." ROUNDS
    python docs/benchmarks/step-clock/steps.py code-gen "none;draft:2;draft:4;draft:6" 2
"""
import statistics
import sys
import time

from specdec import LLM, SamplingParams
from specdec.bench.prompts import BUILTIN_PROMPTS
from specdec.config import SpeculativeConfig
from specdec.engine.drafting import Drafting
from specdec.engine.model_runner import ModelRunner

STEPS = []                      # (method, rows, context, seconds of the forward, seconds of the step's drafting)
NOW = {"method": "warm-up", "draft_s": 0.0}
_execute, _propose = ModelRunner.execute, Drafting.propose


def execute(self, decodes, drafts, prefills, reader):
    t0 = time.perf_counter()
    run = _execute(self, decodes, drafts, prefills, reader)
    if decodes and not prefills:
        STEPS.append((NOW["method"], run.num_rows, decodes[0].num_computed, time.perf_counter() - t0, NOW["draft_s"]))
    return run


def propose(self, seqs, rows):
    t0 = time.perf_counter()
    plans = _propose(self, seqs, rows)
    NOW["draft_s"] = time.perf_counter() - t0
    return plans


def spec(method: str) -> SpeculativeConfig:
    name, _, k = method.partition(":")
    return SpeculativeConfig(method=name, num_speculative_tokens=int(k) if k else None)


def main(cats: list[str], methods: list[str], rounds: int) -> None:
    ModelRunner.execute, Drafting.propose = execute, propose
    llm = LLM(enable_prefix_caching=False, progress=False, speculative=SpeculativeConfig(method="auto"))
    cost = llm.policy().cost
    prompts = [llm.encode(p["messages"]) for p in BUILTIN_PROMPTS if p["category"] in cats]
    for m in methods:
        llm.generate(prompts[0], SamplingParams(max_tokens=4, temperature=0.0), spec=spec(m))
    STEPS.clear()
    params = SamplingParams(max_tokens=128, temperature=0.0)
    for r in range(rounds):
        for i, ids in enumerate(prompts):
            for m in methods:
                NOW["method"] = m
                out = llm.generate(ids, params, spec=spec(m), cache_salt=f"{m}-{r}")[0]
                st, n = out.stats, len(out.token_ids)
                print(f"round {r + 1} prompt {i} {m}: decode {(n - 1) / (st.e2e_s - st.ttft_s):.1f} tok/s, "
                      f"{st.method} k={st.num_speculative_tokens}", flush=True)
    by_rows: dict[int, list[float]] = {}
    for _, rows, _, s, _ in STEPS:
        by_rows.setdefault(rows, []).append(s)
    one = statistics.median(by_rows.get(1, [float("nan")]))
    ref = cost.at(statistics.median(c for _, _, c, _, _ in STEPS))
    print(f"\ncost model: plain step {ref.target_step_s * 1000:.2f} ms, c {ref.draft_step:.3f}; "
          f"decoding here: plain step {one * 1000:.2f} ms (median)")
    print("| rows | steps | median ms | V here | V priced |\n|---|---|---|---|---|")
    for n in sorted(by_rows):
        t = statistics.median(by_rows[n])
        print(f"| {n} | {len(by_rows[n])} | {t * 1000:.2f} | {t / one:.3f} | {ref.V(n):.3f} |")
    print("\n| method | rows | steps | drafting ms | per drafted token / plain step |\n|---|---|---|---|---|")
    for m in methods:
        if not m.startswith("draft"):
            continue
        mine = [(rows, d) for mm, rows, _, _, d in STEPS if mm == m and rows > 1]
        for n in sorted({rows for rows, _ in mine}):
            d = statistics.median(x for rows, x in mine if rows == n)
            count = sum(1 for rows, _ in mine if rows == n)
            print(f"| {m} | {n} | {count} | {d * 1000:.2f} | {d / (n - 1) / one:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1].split(","), sys.argv[2].split(";"), int(sys.argv[3]))
