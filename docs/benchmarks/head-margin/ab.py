"""`auto` with a learned head starting a request wherever its expected speed beats the draft model's (margin 1.0, as
before) against a head starting one only where it is expected 1.1x the draft's, beside speculation off, the fixed
draft (k = 4) and hybrid (the draft beside prompt lookup under the step controller, no method choice), in one `LLM`,
interleaved: each prompt runs every variant (the order rotated per prompt) before the next prompt, ROUNDS times.
Each controller variant keeps its own clock (fed only its own requests' steps) and its own pool; every (variant,
round) its own suffix pools. Greedy, 128 tokens, the shipped heads loaded as `specdec serve` loads them, each request
started on an idle machine.

    python docs/benchmarks/head-margin/ab.py OUT_DIR [ROUNDS] [PROMPTS]
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

VARIANTS = ["none", "draft", "hybrid", "auto-1.0", "auto-1.1"]


def run(llm, clocks, ids, variant, params, salt="warm"):
    policy = llm.policy()
    policy.clock = clocks[variant]
    policy.cost = policy.clock.current
    if variant.startswith("auto"):
        policy.cfg.head_margin = float(variant.split("-")[1])
        spec = SpeculativeConfig(method="auto")
    elif variant == "hybrid":
        spec = SpeculativeConfig(method="hybrid")
    else:
        spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
    wait_until_idle()
    out = llm.generate(ids, params, spec=spec, pool=variant, cache_salt=f"{variant}-{salt}")[0]
    s = out.stats
    return {**request_figures(out), "method": s.method, "reason": s.policy_reason, "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens, "target_forwards": s.target_forwards}


def main(out_dir: str, rounds: int, source: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(source)
    llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
    measured = llm.policy().clock.measured
    sink = StepClock(measured, probe_every=0)
    clocks = {"none": sink, "draft": sink, **{v: StepClock(measured) for v in VARIANTS[2:]}}
    ids = [llm.encode(p["messages"]) for p in prompts]
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for v in ("none", "draft"):
        run(llm, clocks, ids[0], v, warm)
    params = SamplingParams(max_tokens=128, temperature=0.0)
    rows = interleave(prompts, ids, VARIANTS, rounds, lambda pid, v, salt: run(llm, clocks, pid, v, params, salt))
    save(out, {"source": source, "rounds": rounds, "measured": measured.to_dict(), "rows": rows}, report(rows))


def table(rows, key, better) -> list[str]:
    return ratio_table(rows, VARIANTS, key, better,
                       [("1.1 / 1.0", lambda s: s["auto-1.1"] / s["auto-1.0"]),
                        ("1.1 / best fixed", lambda s: s["auto-1.1"] / max(s["draft"], 1.0))])


def report(rows) -> str:
    same, others = same_text(rows)
    out = speed_tables(rows, table, " (best fixed: the fixed draft, or off where it loses)")
    for v in VARIANTS[3:]:
        out += ["", f"{v} ran: {methods_ran(rows, v)}"]
    out += ["", f"Text identical to speculation off: {same} of {others}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    a = sys.argv
    main(a[1], int(a[2]) if len(a) > 2 else 2, a[3] if len(a) > 3 else "builtin")
