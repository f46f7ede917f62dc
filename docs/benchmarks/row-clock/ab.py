"""`auto` priced by the step clock as it was (a step less its extra rows at their measured seconds: every row count
scaled by one plain-step ratio) against the clock that prices each row count from its own steps, beside speculation
off and the fixed draft, in one `LLM`, interleaved: each prompt runs every variant (the order rotated per prompt)
before the next prompt, ROUNDS times. Each auto variant keeps its own clock (fed only its own requests' steps), its
own pool, and every (variant, round) its own suffix pools (`cache_salt`). Greedy, 128 tokens, the shipped heads
loaded as `specdec serve` loads them, each request started on an idle machine.

    python docs/benchmarks/row-clock/ab.py OUT_DIR [ROUNDS] [PROMPTS] [METHOD]

METHOD auto (default) or hybrid: the draft beside prompt lookup under the step controller for every request, no
choice of method, so what differs between the two variants is only how the step is priced (the draft's k, and
lookup against the draft per step).
"""
import statistics
import sys
from pathlib import Path

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle
from specdec.bench.interleaved import interleave, ratio_table, request_figures, same_text, save, speed_tables
from specdec.config import SpeculativeConfig
from specdec.policy.clock import StepClock

VARIANTS = ["none", "draft", "auto-before", "auto-after"]


def run(llm, clocks, ids, variant, params, salt="warm", method="auto"):
    policy = llm.policy()
    if variant.startswith("auto"):
        policy.clock = clocks[variant]
        policy.cost = policy.clock.current
        spec, pool = SpeculativeConfig(method=method), variant
    else:
        spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
        pool = "default"
    wait_until_idle()
    out = llm.generate(ids, params, spec=spec, pool=pool, cache_salt=f"{variant}-{salt}")[0]
    s = out.stats
    return {**request_figures(out), "method": s.method, "reason": s.policy_reason, "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens, "target_forwards": s.target_forwards,
            "clock": policy.clock.status() if variant.startswith("auto") else None,
            "V5": policy.cost.V(5) if variant.startswith("auto") else None}


def main(out_dir: str, rounds: int, source: str, method: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(source)
    llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
    measured = llm.policy().clock.measured
    # the clock before: one-row steps never read on their own (min_samples out of reach), as it ran until now
    clocks = {"auto-before": StepClock(measured, min_samples=10 ** 9), "auto-after": StepClock(measured)}
    ids = [llm.encode(p["messages"]) for p in prompts]
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for v in ("none", "draft"):
        run(llm, clocks, ids[0], v, warm)
    params = SamplingParams(max_tokens=128, temperature=0.0)
    rows = interleave(prompts, ids, VARIANTS, rounds,
                      lambda pid, v, salt: run(llm, clocks, pid, v, params, salt, method))
    save(out, {"source": source, "rounds": rounds, "method": method, "measured": measured.to_dict(), "rows": rows},
         report(rows))


def table(rows, key, better) -> list[str]:
    """Median over requests of `better(variant's key, speculation off's key)` (same prompt, same round)."""
    return ratio_table(rows, VARIANTS, key, better, [("after / before", lambda s: s["auto-after"] / s["auto-before"]),
                                                     ("after / draft", lambda s: s["auto-after"] / s["draft"])])


def report(rows) -> str:
    same, others = same_text(rows)
    out = speed_tables(rows, table)
    for v in ("auto-before", "auto-after"):
        mine = [r for r in rows if r["variant"] == v]
        methods = {}
        for r in mine:
            methods[r["method"]] = methods.get(r["method"], 0) + 1
        v5 = [r["V5"] for r in mine]
        last = mine[-1]["clock"]
        out += ["", f"{v}: methods {methods}; V(5) priced min {min(v5):.2f} median {statistics.median(v5):.2f} "
                    f"max {max(v5):.2f}; its clock at the end: plain step {last['plain_step_s'] * 1000:.1f} ms "
                    f"({last['plain_step_ratio']:.2f}x the measured), row scales {last['row_scales']}"]
    base = {(r["round"], r["prompt"]): r for r in rows if r["variant"] == "none"}
    fw = [1000 * (r["e2e_s"] - r["ttft_s"]) / max(1, r["target_forwards"] - 1) for r in base.values()]
    out += ["", f"Speculation off's decode step: median {statistics.median(fw):.1f} ms [{min(fw):.1f} - {max(fw):.1f}]"]
    out += ["", f"Text identical to speculation off: {same} of {others}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2,
         sys.argv[3] if len(sys.argv) > 3 else "builtin", sys.argv[4] if len(sys.argv) > 4 else "auto")
