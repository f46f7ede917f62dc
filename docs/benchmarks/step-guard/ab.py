"""`auto` without and with the step guard (a request whose last 16 steps, by the wall clock, commit tokens at under
0.95x the rate of its own plain steps decodes plainly for the rest), beside speculation off and the fixed draft
(k = 4), in one `LLM`, interleaved: each prompt runs every variant (the order rotated per prompt) before the next
prompt, ROUNDS times. Each auto variant keeps its own clock (fed only its own requests' steps) and its own pool; every
(variant, round) its own suffix pools. Greedy, 128 tokens, the shipped heads loaded as `specdec serve` loads them,
each request started on an idle machine.

    python docs/benchmarks/step-guard/ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import sys
from pathlib import Path

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle
from specdec.bench.interleaved import (
    interleave,
    methods_ran,
    ratio_table,
    request_figures,
    same_text,
    save,
    speed_tables,
)
from specdec.config import SpeculativeConfig
from specdec.policy.clock import StepClock
from specdec.policy.decide import StepController

VARIANTS = ["none", "draft", "auto-before", "auto-after"]
MARGIN = getattr(StepController, "guard_margin", None)     # reverted after this run: the script runs at 811fa32


def run(llm, clocks, ids, variant, params, salt="warm"):
    policy = llm.policy()
    policy.clock = clocks[variant]
    policy.cost = policy.clock.current
    StepController.guard_margin = MARGIN if variant == "auto-after" else 0.0     # 0: never trips
    if variant.startswith("auto"):
        spec = SpeculativeConfig(method="auto")
    else:
        spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
    wait_until_idle()
    out = llm.generate(ids, params, spec=spec, pool=variant, cache_salt=f"{variant}-{salt}")[0]
    s = out.stats
    return {**request_figures(out), "method": s.method, "reason": s.policy_reason, "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens, "target_forwards": s.target_forwards}


def main(out_dir: str, rounds: int, source: str) -> None:
    if MARGIN is None:
        sys.exit("step-guard: the step guard was reverted; run this script at commit 811fa32")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(source)
    llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
    measured = llm.policy().clock.measured
    sink = StepClock(measured, probe_every=0)
    clocks = {"none": sink, "draft": sink, "auto-before": StepClock(measured), "auto-after": StepClock(measured)}
    ids = [llm.encode(p["messages"]) for p in prompts]
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for v in ("none", "draft"):
        run(llm, clocks, ids[0], v, warm)
    params = SamplingParams(max_tokens=128, temperature=0.0)
    rows = interleave(prompts, ids, VARIANTS, rounds, lambda pid, v, salt: run(llm, clocks, pid, v, params, salt))
    save(out, {"source": source, "rounds": rounds, "measured": measured.to_dict(), "rows": rows}, report(rows))


def table(rows, key, better) -> list[str]:
    return ratio_table(rows, VARIANTS, key, better,
                       [("after / before", lambda s: s["auto-after"] / s["auto-before"]),
                        ("after / best fixed", lambda s: s["auto-after"] / max(s["draft"], 1.0))])


def report(rows) -> str:
    same, others = same_text(rows)
    out = speed_tables(rows, table, " (best fixed: the fixed draft, or off where it loses)")
    for v in VARIANTS[2:]:
        tripped = sum("plain decoding" in (r["reason"] or "") for r in rows if r["variant"] == v)
        out += ["", f"{v} ran: {methods_ran(rows, v)}; the guard turned {tripped} to plain decoding"]
    out += ["", f"Text identical to speculation off: {same} of {others}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    a = sys.argv
    main(a[1], int(a[2]) if len(a) > 2 else 2, a[3] if len(a) > 3 else "builtin")
