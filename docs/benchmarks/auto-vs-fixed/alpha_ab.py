"""A request's α from its steps each at its own k (StepController, "after") against one k for their mean ("before":
the mean's rounding moved α by 0.05-0.09 from one step to the next and k with it), beside speculation off and the
fixed draft (k = 4), in one `LLM`, interleaved: each prompt runs every variant (the order rotated per prompt) before
the next prompt, ROUNDS times. Each auto variant keeps its own pool, which learns across the prompts in their order
as a served pool does (the code edits first); hybrid (the draft and the longest match per step, from the first step)
runs both ways too. Greedy, 128 tokens, the shipped heads loaded as `specdec serve` loads them, each request started
on an idle machine.

    python docs/benchmarks/auto-vs-fixed/alpha_ab.py OUT_DIR [ROUNDS] [PROMPTS]
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
from specdec.policy import decide, pools

VARIANTS = ["none", "draft", "hybrid-before", "hybrid-after", "auto-before", "auto-after"]
AFTER = pools.StepController


class MeanK(AFTER):
    """The controller as it was: its draft steps' α at the rounded mean of their draft lengths."""

    @property
    def alpha(self) -> float:
        if not self.steps:
            return self.prior_alpha
        own = decide.effective_alpha(1 + self.accepted / self.steps, max(1, round(self.drafted / self.steps)))
        w = self.prior_steps
        return (self.prior_alpha * w + own * self.steps) / (w + self.steps)


def run(llm, ids, variant, params, salt="warm"):
    pools.StepController = MeanK if variant.endswith("before") else AFTER
    kind = variant.split("-")[0]
    if kind in ("auto", "hybrid"):
        spec, pool = SpeculativeConfig(method=kind), variant
    else:
        spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
        pool = "default"
    wait_until_idle()
    try:
        out = llm.generate(ids, params, spec=spec, pool=pool, cache_salt=f"{variant}-{salt}")[0]
    finally:
        pools.StepController = AFTER
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
                  "| category (requests) | " + " | ".join(VARIANTS[1:])
                  + " | hybrid after / before | auto after / before |",
                  "|---" * (len(VARIANTS) + 2) + "|"]
        for cat, n, med in ratio_medians(rows, VARIANTS[1:], key, better):
            lines.append(f"| {cat} ({n}) | " + " | ".join(f"{med[v]:.2f}x" for v in VARIANTS[1:]) +
                         f" | {med['hybrid-after'] / med['hybrid-before']:.2f} | "
                         f"{med['auto-after'] / med['auto-before']:.2f} |")
        lines.append("")
    for r in sorted({r["round"] for r in rows}):
        got = {v: statistics.median(x["decode_tok_s"] / off[x["round"], x["prompt"]]["decode_tok_s"] for x in rows
                                    if x["variant"] == v and x["round"] == r) for v in VARIANTS[1:]}
        lines.append(f"round {r}: decode over off's " + ", ".join(f"{v} {s:.2f}x" for v, s in got.items()))
    lines.append("")
    for v in VARIANTS[1:]:
        fw = sum(r["forwards"] for r in rows if r["variant"] == v)
        lines.append(f"{v}: {fw} target forwards in all")
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
