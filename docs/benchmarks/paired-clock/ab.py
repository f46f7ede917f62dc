"""The step clock as it was (each row count's median over a window against the one-row steps' median over the same
window, no plain step asked for) against the clock that prices each step against the plain steps of the same moment
and asks a lone sequence for a plain step when none was timed for 16 steps, beside speculation off and the fixed
draft, in one `LLM`, interleaved: each prompt runs every variant (the order rotated per prompt) before the next
prompt, ROUNDS times. Each controller variant keeps its own clock, fed only its own requests' steps (the other
variants' steps go to a clock nobody reads), and its own pool; every (variant, round) its own suffix pools. Greedy,
128 tokens, each request started on an idle machine.

    python docs/benchmarks/paired-clock/ab.py OUT_DIR [ROUNDS] [PROMPTS] [METHOD] [BEFORE_CLOCK_PY]

METHOD hybrid (default: the draft beside prompt lookup for every request, no choice of method, so what differs is
how the steps are priced: the draft's k, lookup against the draft per step) or auto. BEFORE_CLOCK_PY: the clock
module before (`git show 830162d:specdec/policy/clock.py > before_clock.py`).
"""
import collections
import importlib.util
import statistics
import sys
from pathlib import Path

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle
from specdec.bench.interleaved import interleave, ratio_table, request_figures, same_text, save, speed_tables
from specdec.config import SpeculativeConfig
from specdec.policy.clock import StepClock

VARIANTS = ["none", "draft", "before", "after"]


def load_before(path: str):
    """The clock class of an earlier commit's clock.py (its one relative import made absolute)."""
    src = Path(path).read_text().replace("from .cost_model import", "from specdec.policy.cost_model import")
    spec = importlib.util.spec_from_loader("before_clock", loader=None)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(src, path, "exec"), mod.__dict__)
    cls = mod.StepClock
    if not hasattr(cls, "wants_plain"):
        cls.wants_plain = lambda self: False       # it never asked for a plain step
    return cls


def run(llm, clocks, ids, variant, params, salt="warm", method="hybrid"):
    policy = llm.policy()
    policy.clock = clocks[variant]
    policy.cost = policy.clock.current
    if variant in ("before", "after"):
        spec, pool = SpeculativeConfig(method=method), variant
    else:
        spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
        pool = "default"
    wait_until_idle()
    out = llm.generate(ids, params, spec=spec, pool=pool, cache_salt=f"{variant}-{salt}")[0]
    s = out.stats
    mine = variant in ("before", "after")
    return {**request_figures(out), "method": s.method, "reason": s.policy_reason, "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens, "target_forwards": s.target_forwards,
            "draft_steps": s.draft_steps, "lookup_steps": s.lookup_steps,
            "drafted_per_position": s.drafted_per_position,
            "clock": policy.clock.status() if mine else None, "V5": policy.cost.V(5) if mine else None,
            "c": policy.cost.draft_step if mine else None}


def main(out_dir: str, rounds: int, source: str, method: str, before_py: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(source)
    llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
    measured = llm.policy().clock.measured
    sink = StepClock(measured, probe_every=0)
    clocks = {"none": sink, "draft": sink, "before": load_before(before_py)(measured), "after": StepClock(measured)}
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
    return ratio_table(rows, VARIANTS, key, better, [("after / before", lambda s: s["after"] / s["before"]),
                                                     ("after / draft", lambda s: s["after"] / s["draft"])])


def report(rows) -> str:
    same, others = same_text(rows)
    out = speed_tables(rows, table)
    for v in ("before", "after"):
        mine = [r for r in rows if r["variant"] == v]
        per_k = collections.Counter()
        for r in mine:
            d = r["drafted_per_position"] + [0]
            for k in range(1, len(d)):
                per_k[k] += d[k - 1] - d[k]        # draft steps that drafted exactly k tokens
        v5 = [r["V5"] for r in mine]
        last = mine[-1]["clock"]
        fw = sum(r["target_forwards"] for r in mine)
        out += ["", f"{v}: draft steps by k {dict(sorted(per_k.items()))} (draft-model and lookup steps), "
                    f"lookup steps {sum(r['lookup_steps'] for r in mine)}, tokens per forward "
                    f"{sum(r['tokens'] - 1 for r in mine) / fw:.2f}; V(5) priced min {min(v5):.2f} median "
                    f"{statistics.median(v5):.2f} max {max(v5):.2f}; its clock at the end: plain step "
                    f"{last['plain_step_s'] * 1000:.1f} ms ({last['plain_step_ratio']:.2f}x the measured), row scales "
                    f"{last['row_scales']}, draft step scale {last['draft_step_scale']}"]
    base = {(r["round"], r["prompt"]): r for r in rows if r["variant"] == "none"}
    fw = [1000 * (r["e2e_s"] - r["ttft_s"]) / max(1, r["target_forwards"] - 1) for r in base.values()]
    out += ["", f"Speculation off's decode step: median {statistics.median(fw):.1f} ms [{min(fw):.1f} - {max(fw):.1f}]"]
    out += ["", f"Text identical to speculation off: {same} of {others}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    a = sys.argv
    main(a[1], int(a[2]) if len(a) > 2 else 2, a[3] if len(a) > 3 else "builtin", a[4] if len(a) > 4 else "hybrid",
         a[5] if len(a) > 5 else "before_clock.py")
