"""`auto` priced as measured against `auto` re-priced by its step clock, and with a head's (or a lone lookup's)
request free to move to the draft model, beside speculation off and the fixed draft, in one `LLM`, interleaved:
each prompt runs every variant (the order rotated per prompt) before the next prompt, ROUNDS times. Each auto
variant keeps its own pool and every (variant, round) its own suffix pools (`cache_salt`). Greedy, 128 tokens, the
shipped heads loaded as `specdec serve` loads them, each request started on an idle machine.

    python docs/benchmarks/step-clock/ab.py OUT_DIR [ROUNDS] [PROMPTS]

Variants: none; draft (k = 4); auto-measured (the cost model as measured or cached, no move: as before); auto-clock
(re-priced by the clock, no move); auto-after (re-priced, and a request may move to the draft: what this commit runs).
"""
import sys
from pathlib import Path

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle
from specdec.bench.interleaved import interleave, ratio_table, request_figures, same_text, save, speed_tables
from specdec.config import SpeculativeConfig
from specdec.policy.decide import StepController

VARIANTS = ["none", "draft", "auto-measured", "auto-clock", "auto-after"]
MOVE = StepController._maybe_switch


def run(llm, ids, variant, params, salt="warm"):
    policy = llm.policy()
    saved = policy.clock, policy.cost
    if variant == "auto-measured":
        policy.clock, policy.cost = None, policy.clock.measured
    StepController._maybe_switch = MOVE if variant == "auto-after" else (lambda self, why, mine: None)
    if variant.startswith("auto"):
        spec, pool = SpeculativeConfig(method="auto"), variant
    else:
        spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
        pool = "default"
    wait_until_idle()
    try:
        out = llm.generate(ids, params, spec=spec, pool=pool, cache_salt=f"{variant}-{salt}")[0]
    finally:
        if variant == "auto-measured":
            policy.clock, policy.cost = saved
        StepController._maybe_switch = MOVE
    s = out.stats
    return {**request_figures(out), "method": s.method, "reason": s.policy_reason, "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens, "clock": policy.clock.status()}


def main(out_dir: str, rounds: int, source: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(source)
    llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
    llm.policy()
    ids = [llm.encode(p["messages"]) for p in prompts]
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for v in ("none", "draft"):
        run(llm, ids[0], v, warm)
    params = SamplingParams(max_tokens=128, temperature=0.0)
    rows = interleave(prompts, ids, VARIANTS, rounds, lambda pid, v, salt: run(llm, pid, v, params, salt))
    save(out, {"source": source, "rounds": rounds, "rows": rows}, report(rows))


def table(rows, key, better) -> list[str]:
    """Median over requests of `better(variant's key, speculation off's key)` (same prompt, same round)."""
    return ratio_table(rows, VARIANTS, key, better,
                       [("after / measured", lambda s: s["auto-after"] / s["auto-measured"]),
                        ("after / draft", lambda s: s["auto-after"] / s["draft"])])


def report(rows) -> str:
    same, others = same_text(rows)
    out = speed_tables(rows, table)
    moved = [r for r in rows if r["variant"] == "auto-after" and "moved to" in (r["reason"] or "")]
    out += ["", f"Requests of auto-after that moved to the draft: {len(moved)}"]
    out += [f"- round {r['round']} prompt {r['prompt']} ({r['category']}): {r['reason']}" for r in moved]
    last = rows[-1]["clock"]
    out += ["", f"The clock at the end: plain step {last['plain_step_s'] * 1000:.1f} ms, "
                f"{last['plain_step_ratio']:.2f}x the measured one, {last['steps_timed']} steps timed"]
    out += ["", f"Text identical to speculation off: {same} of {others}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2,
         sys.argv[3] if len(sys.argv) > 3 else "builtin")
