"""`auto` whose lookup-alone requests may move to the draft after 4 of their steps ("after") against after 8 (as
shipped, StepController.lookup_switch_after; "before"), beside speculation off and the fixed draft (k = 4), in one
`LLM`, interleaved: each prompt runs every variant (the order rotated per prompt) before the next prompt, ROUNDS
times; each auto variant its own pool, learning across the prompts in their order as a served pool does. Greedy, 128
tokens, the shipped heads loaded as `specdec serve` loads them, each request started on an idle machine. Tried, not
kept (docs/benchmarks/auto-vs-fixed/README.md).

    python docs/benchmarks/auto-vs-fixed/switch_ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import json
import statistics
import sys
from pathlib import Path

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle
from specdec.bench.interleaved import interleave, ratio_medians, request_figures
from specdec.config import SpeculativeConfig
from specdec.policy import pools

VARIANTS = ["none", "draft", "auto-before", "auto-after"]


class Early(pools.StepController):
    lookup_switch_after = 4


def run(llm, ids, variant, params, salt="warm"):
    base = pools.StepController
    pools.StepController = Early if variant == "auto-after" else base
    if variant.startswith("auto"):
        spec, pool = SpeculativeConfig(method="auto"), variant
    else:
        spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
        pool = "default"
    wait_until_idle()
    try:
        out = llm.generate(ids, params, spec=spec, pool=pool, cache_salt=f"{variant}-{salt}")[0]
    finally:
        pools.StepController = base
    s = out.stats
    return {**request_figures(out), "method": s.method, "reason": s.policy_reason, "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens, "forwards": s.target_forwards}


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
    (out / "results.json").write_text(json.dumps({"source": source, "rounds": rounds, "rows": rows}, indent=1))
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
        got = {v: statistics.median(x["decode_tok_s"] / off[x["round"], x["prompt"]]["decode_tok_s"] for x in rows
                                    if x["variant"] == v and x["round"] == r) for v in VARIANTS[1:]}
        lines.append(f"round {r}: decode over off's " + ", ".join(f"{v} {s:.2f}x" for v, s in got.items()))
    lines.append("")
    cats = list(dict.fromkeys(r["category"] for r in rows))
    for v in VARIANTS[1:]:
        fw = {c: sum(r["forwards"] for r in rows if r["variant"] == v and r["category"] == c) for c in cats}
        lines.append(f"{v}: target forwards " + ", ".join(f"{c} {n}" for c, n in fw.items())
                     + f", all {sum(fw.values())}")
    for v in ("auto-before", "auto-after"):
        ran = {}
        for r in rows:
            if r["variant"] == v:
                ran[(r["category"], r["method"])] = ran.get((r["category"], r["method"]), 0) + 1
        lines.append(f"{v} ran: " + ", ".join(f"{c} {m} x{n}" for (c, m), n in sorted(ran.items())))
    same = sum(r["text"] == off[r["round"], r["prompt"]]["text"] for r in rows)
    lines.append(f"\nText identical to speculation off: {same} of {len(rows)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3] if len(sys.argv) > 3 else "builtin")
