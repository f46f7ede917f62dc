"""`auto` as a commit before chose (REV's `choose`, loaded from git) against `auto` as the working tree chooses, beside
speculation off and the fixed draft, in one `LLM`, interleaved: each prompt runs every variant (the order rotated per
prompt) before the next prompt, ROUNDS times. Each auto variant keeps its own pool and every (variant, round) its own
suffix pools (`cache_salt`). Greedy, 128 tokens, the shipped heads loaded as `specdec serve` loads them, each request
started on an idle machine.

    python docs/benchmarks/suffix-alone/ab.py OUT_DIR REV [ROUNDS] [PROMPTS]
"""
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle
from specdec.bench.interleaved import interleave, ratio_medians, request_figures
from specdec.config import SpeculativeConfig
from specdec.policy import pools

VARIANTS = ["none", "draft", "auto-before", "auto-after"]
AFTER = pools.choose


def choose_of(rev: str):
    """`choose` as the decide.py of commit `rev` has it (its StepController is not used)."""
    source = subprocess.check_output(["git", "show", f"{rev}:specdec/policy/decide.py"], text=True)
    spec = importlib.util.spec_from_loader("specdec.policy.decide_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "specdec.policy"
    sys.modules[spec.name] = module
    exec(compile(source, f"{rev}:specdec/policy/decide.py", "exec"), module.__dict__)
    return module.choose


def run(llm, ids, variant, params, before, salt="warm"):
    pools.choose = before if variant == "auto-before" else AFTER
    if variant.startswith("auto"):
        spec, pool = SpeculativeConfig(method="auto"), variant
    else:
        spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
        pool = "default"
    wait_until_idle()
    try:
        out = llm.generate(ids, params, spec=spec, pool=pool, cache_salt=f"{variant}-{salt}")[0]
    finally:
        pools.choose = AFTER
    s = out.stats
    return {**request_figures(out), "method": s.method, "reason": s.policy_reason, "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens}


def main(out_dir: str, rev: str, rounds: int, source: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = choose_of(rev)
    prompts = load_prompts(source)
    llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
    llm.policy()
    ids = [llm.encode(p["messages"]) for p in prompts]
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for v in ("none", "draft"):
        run(llm, ids[0], v, warm, before)
    params = SamplingParams(max_tokens=128, temperature=0.0)
    rows = interleave(prompts, ids, VARIANTS, rounds, lambda pid, v, salt: run(llm, pid, v, params, before, salt))
    (out / "results.json").write_text(json.dumps({"source": source, "rev": rev, "rounds": rounds, "rows": rows},
                                                 indent=1))
    (out / "report.md").write_text(report(rows))
    print(report(rows))


def report(rows) -> str:
    off = {(r["round"], r["prompt"]): r for r in rows if r["variant"] == "none"}
    lines = []
    for title, key, better in (("Decode speed (tokens after the first over the time after the first)",
                                "decode_tok_s", lambda v, o: v / o),
                               ("End to end (speculation off's request time over the variant's)", "e2e_s",
                                lambda v, o: o / v)):
        lines += [f"{title}, over speculation off's, median over requests:", "",
                  "| category (requests) | draft | auto-before | auto-after | after / before | after / draft |",
                  "|---|---|---|---|---|---|"]
        for cat, n, med in ratio_medians(rows, VARIANTS[1:], key, better):
            lines.append(f"| {cat} ({n}) | {med['draft']:.2f}x | {med['auto-before']:.2f}x | "
                         f"{med['auto-after']:.2f}x | {med['auto-after'] / med['auto-before']:.2f} | "
                         f"{med['auto-after'] / med['draft']:.2f} |")
        lines.append("")
    for r in sorted({r["round"] for r in rows}):
        got = {v: statistics.median(x[ "decode_tok_s"] / off[x["round"], x["prompt"]]["decode_tok_s"] for x in rows
                                    if x["variant"] == v and x["round"] == r) for v in VARIANTS[1:]}
        lines.append(f"round {r}: decode over off's " + ", ".join(f"{v} {s:.2f}x" for v, s in got.items()))
    lines.append("")
    for v in ("auto-before", "auto-after"):
        ran = {}
        for r in rows:
            if r["variant"] == v:
                ran[(r["category"], r["method"])] = ran.get((r["category"], r["method"]), 0) + 1
        lines.append(f"{v} ran: " + ", ".join(f"{c} {m} x{n}" for (c, m), n in sorted(ran.items())))
    moved = [r for r in rows if r["variant"].startswith("auto") and "moved to" in (r["reason"] or "")]
    lines.append(f"\nRequests that moved to the draft: {len(moved)}")
    same = sum(r["text"] == off[r["round"], r["prompt"]]["text"] for r in rows)
    lines.append(f"\nText identical to speculation off: {same} of {len(rows)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2,
         sys.argv[4] if len(sys.argv) > 4 else "builtin")
