"""What the in-process A/Bs of auto's policy share (alpha_ab.py, size_ab.py, switch_ab.py): one `LLM`, each prompt
through every variant (the order rotated per prompt) before the next prompt, ROUNDS times, each request started on
an idle machine; greedy, 128 tokens, the shipped heads loaded as `specdec serve` loads them. A variant is "none" or
"draft" (fixed, k = 4), or "<method>-<arm>" ("auto-after", "hybrid-before"): that method in a pool of its own, which
learns across the prompts in their order as a served pool does (the code edits first). A script sets its arm's
policy around `request` and hands its `run` to `main`."""
import json
import statistics
from pathlib import Path

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.idle import wait_until_idle
from specdec.bench.interleaved import interleave, ratio_medians, request_figures
from specdec.config import SpeculativeConfig
from specdec.policy import pools


def request(llm, ids, variant, params, salt, controller=None, spec=None, pool="default") -> dict:
    """One request of this variant on an idle machine: its figures, the method auto ran and why, its draft's tokens
    and its target forwards. `controller`: the StepController class its policy builds for it (the shipped one
    otherwise); `spec` and `pool`: the variant's own config and pool, where the script sets them (else read from the
    variant's name)."""
    if controller is not None:
        shipped, pools.StepController = pools.StepController, controller
        try:
            return request(llm, ids, variant, params, salt, spec=spec, pool=pool)
        finally:
            pools.StepController = shipped
    if spec is None:
        kind = variant.split("-")[0]
        if kind in ("auto", "hybrid"):
            spec, pool = SpeculativeConfig(method=kind), variant
        else:
            spec = SpeculativeConfig(method=variant, num_speculative_tokens=4 if variant != "none" else None)
    wait_until_idle()
    out = llm.generate(ids, params, spec=spec, pool=pool, cache_salt=f"{variant}-{salt}")[0]
    s = out.stats
    return {**request_figures(out), "method": s.method, "reason": s.policy_reason, "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens, "forwards": s.target_forwards}


def main(out_dir: str, rounds: int, source: str, variants: list[str], run, pairs: list[tuple[str, str]]) -> None:
    """run(llm, ids, variant, params, salt) -> a row (the script's arms around `request`); `pairs`: the (variant,
    over variant) ratios the report adds per category. Writes OUT_DIR/results.json and report.md."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(source)
    llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
    llm.policy()
    ids = [llm.encode(p["messages"]) for p in prompts]
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for v in ("none", "draft"):
        run(llm, ids[0], v, warm, "warm")
    params = SamplingParams(max_tokens=128, temperature=0.0)
    rows = interleave(prompts, ids, variants, rounds, lambda pid, v, salt: run(llm, pid, v, params, salt))
    (out / "results.json").write_text(json.dumps({"source": source, "rounds": rounds, "rows": rows}, indent=1))
    text = report(rows, variants, pairs)
    (out / "report.md").write_text(text)
    print(text)


def report(rows: list[dict], variants: list[str], pairs: list[tuple[str, str]]) -> str:
    """Decode and end-to-end speed over speculation off's by category (median per request), the rounds, target
    forwards, what each auto variant ran, and how many texts equal speculation off's."""
    shown = [v for v in variants if v != "none"]
    off = {(r["round"], r["prompt"]): r for r in rows if r["variant"] == "none"}
    lines = []
    for title, key, better in (("Decode speed (tokens after the first over the time after the first)",
                                "decode_tok_s", lambda v, o: v / o),
                               ("End to end (speculation off's request time over the variant's)", "e2e_s",
                                lambda v, o: o / v)):
        heads = shown + [f"{a} / {b}" for a, b in pairs]
        lines += [f"{title}, over speculation off's, median over requests:", "",
                  "| category (requests) | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
        for cat, n, med in ratio_medians(rows, shown, key, better):
            cells = [f"{med[v]:.2f}x" for v in shown] + [f"{med[a] / med[b]:.2f}" for a, b in pairs]
            lines.append(f"| {cat} ({n}) | " + " | ".join(cells) + " |")
        lines.append("")
    for r in sorted({r["round"] for r in rows}):
        got = {v: statistics.median(x["decode_tok_s"] / off[x["round"], x["prompt"]]["decode_tok_s"] for x in rows
                                    if x["variant"] == v and x["round"] == r) for v in shown}
        lines.append(f"round {r}: decode over off's " + ", ".join(f"{v} {s:.2f}x" for v, s in got.items()))
    lines.append("")
    cats = list(dict.fromkeys(r["category"] for r in rows))
    for v in shown:
        fw = {c: sum(r["forwards"] for r in rows if r["variant"] == v and r["category"] == c) for c in cats}
        lines.append(f"{v}: target forwards " + ", ".join(f"{c} {n}" for c, n in fw.items())
                     + f", all {sum(fw.values())}")
    for v in (v for v in shown if v.startswith("auto")):
        ran: dict[tuple[str, str], int] = {}
        for r in rows:
            if r["variant"] == v:
                ran[(r["category"], r["method"])] = ran.get((r["category"], r["method"]), 0) + 1
        lines.append(f"{v} ran: " + ", ".join(f"{c} {m} x{n}" for (c, m), n in sorted(ran.items())))
    same = sum(r["text"] == off[r["round"], r["prompt"]]["text"] for r in rows)
    lines.append(f"\nText identical to speculation off: {same} of {len(rows)}")
    return "\n".join(lines) + "\n"
