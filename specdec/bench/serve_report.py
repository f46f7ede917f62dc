"""`specdec bench serve`'s report: the markdown tables (per level, per category, against each endpoint) and the plots
of a run's results (bench/serve.py measures them)."""
from __future__ import annotations

import json
from pathlib import Path

PCTS = (50, 90, 95, 99)         # the percentiles each level reports


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ms(x):
    return "-" if x is None else f"{x * 1000:.0f}"


def render_serve_report(result: dict, plots: list[str]) -> str:
    cfg = result["config"]
    lines = ["# specdec serving benchmark", "",
             f"- dataset `{cfg['dataset']}` ({cfg['num_prompts']} requests per level), max_tokens {cfg['max_tokens']}, "
             f"temperature {cfg['temperature']:g}, concurrency {', '.join(map(str, cfg['concurrency']))}",
             f"- machine: {result['machine']['cpu']}, {result['machine']['cpu_count']} cores, "
             f"{result['machine']['date']}"]
    for label, url, extra, model in zip(cfg["labels"], cfg["endpoints"], cfg["extra_body"], cfg["models"]):
        lines.append(f"- endpoint `{label}`: {url}, model `{model}`"
                     + (f", extra body `{json.dumps(extra)}`" if extra else ""))
    lines += ["", "TTFT, TPOT, ITL and E2E in ms (P50 / P90 / P95 / P99); throughput over the whole level.", "",
              "| endpoint | conc | ok/err | req/s | out tok/s | TTFT | TPOT | ITL | E2E | accept | MAL | tok/chunk | "
              "identical |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        def pct(name, r=r):
            return " / ".join(_ms(r[f"{name}_p{q}_s"]) for q in PCTS)
        ident = r.get("identical_to_first")
        lines.append(
            f"| {r['endpoint']} | {r['concurrency']} | {r['completed']}/{r['errors']} | "
            f"{r['request_throughput'] or 0:.3f} | {r['output_throughput'] or 0:.2f} | {pct('ttft')} | {pct('tpot')} | "
            f"{pct('itl')} | {pct('e2e')} | {_num(r['acceptance_rate'])} | {_num(r['mean_accepted_length'])} | "
            f"{_num(r['tokens_per_chunk'])} | {_num(ident)} |")
    lines += category_table(result["summary"])
    lines += rounds_table(result["summary"])
    if any(r.get("cached_tokens") is not None for r in result["summary"]):
        lines += ["", "Prompt tokens over the level, as each server's usage reports them: cached (served by its "
                      "prefix cache, prompt_tokens_details.cached_tokens) and computed (the rest).", "",
                  "| endpoint | conc | prompt tokens | cached | computed |", "|---|---|---|---|---|"]
        lines += [f"| {r['endpoint']} | {r['concurrency']} | {r['prompt_tokens']} | "
                  + (f"{r['cached_tokens']} | {r['prompt_tokens'] - r['cached_tokens']} |"
                     if r.get("cached_tokens") is not None else "- | - |")
                  for r in result["summary"]]
    structured = [r for r in result["summary"] if r.get("schema_valid")]
    if structured:
        lines += ["", "Structured outputs: answers that parse and validate against their request's schema, and the "
                      "share of output tokens the grammar forced (verified without drafting).", "",
                  "| endpoint | conc | valid | forced share |", "|---|---|---|---|"]
        lines += [f"| {r['endpoint']} | {r['concurrency']} | {r['schema_valid']} | {_num(r['forced_share'])} |"
                  for r in structured]
    errors = [r for r in result["requests"] if not r["ok"]]
    if errors:
        lines += ["", "## Errors", ""] + [
            f"- {r['endpoint']} c={r['concurrency']} prompt {r['prompt_index']}: {r['error']}" for r in errors[:20]]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def rounds_table(summary: list[dict]) -> list[str]:
    """Per round (a disjoint slice of the prompts, run interleaved): median decode tok/s and its ratio to the first
    endpoint's in that round; then the median ratio over rounds with its spread."""
    rows = [r for r in summary if r.get("rounds")]
    if not rows:
        return []
    n = len(rows[0]["rounds"])
    lines = ["", f"Rounds: the prompts in {n} consecutive slices, each sent interleaved to every endpoint. Median "
                 "decode tok/s per round (ratio to the first endpoint's in the same round), then the median "
                 "ratio over rounds [min - max].", "",
             "| endpoint | conc | " + " | ".join(f"round {i + 1}" for i in range(n)) + " | ratio over rounds |",
             "|---|---|" + "---|" * (n + 1)]
    for r in rows:
        cells = " | ".join("-" if p["decode_tok_s_p50"] is None else f"{p['decode_tok_s_p50']:.2f}"
                           + (f" ({p['decode_ratio']:.2f}x)" if p["decode_ratio"] is not None else "")
                           for p in r["rounds"])
        o = r.get("decode_ratio_over_rounds")
        spread = f"{o['median']:.2f}x [{o['min']:.2f} - {o['max']:.2f}]" if o else "-"
        lines.append(f"| {r['endpoint']} | {r['concurrency']} | {cells} | {spread} |")
    return lines


def category_table(summary: list[dict]) -> list[str]:
    """Median decode tok/s per request by category, with the ratio to the first endpoint at that concurrency."""
    cats = list(dict.fromkeys(c for r in summary for c in r.get("decode_tok_s_by_category", {})))
    if not cats:
        return []
    lines = ["", "Decode tok/s per request (median; (tokens - 1) / (E2E - TTFT)) by category, and its ratio to the "
                 "first endpoint's at the same concurrency.", "",
             "| endpoint | conc | " + " | ".join(cats) + " | all | out tok/s ratio |",
             "|---|---|" + "---|" * (len(cats) + 2)]
    for r in summary:
        by, ratios = r["decode_tok_s_by_category"], r.get("decode_ratio_by_category") or {}

        def cell(v, q):
            return "-" if v is None else f"{v:.2f}" + (f" ({q:.2f}x)" if q is not None else "")
        cells = " | ".join(cell(by.get(c), ratios.get(c)) for c in cats)
        lines.append(f"| {r['endpoint']} | {r['concurrency']} | {cells} | "
                     f"{cell(r['decode_tok_s_p50'], r.get('decode_ratio'))} | {_num(r.get('throughput_ratio'))} |")
    return lines


def write_serve_plots(result: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import _legend, _save

    rows = [r for r in result["summary"] if r["completed"]]
    if not rows:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for label in dict.fromkeys(r["endpoint"] for r in rows):
        sel = sorted((r for r in rows if r["endpoint"] == label), key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in sel]
        axes[0].plot(cs, [(r["ttft_p50_s"] or 0) * 1000 for r in sel], marker="o", label=label)
        axes[1].plot(cs, [(r["tpot_p50_s"] or 0) * 1000 for r in sel], marker="o", label=label)
        axes[2].plot(cs, [r["output_throughput"] or 0 for r in sel], marker="o", label=label)
    for ax, title in zip(axes, ("TTFT P50 (ms)", "TPOT P50 (ms)", "output tok/s")):
        ax.set_xlabel("concurrency")
        ax.set_title(title)
    _legend(axes[2], fontsize=7)
    names = [_save(fig, out / "serve_latency_throughput.png")]
    plt.close(fig)
    for c in dict.fromkeys(r["concurrency"] for r in rows):
        sel = [r for r in rows if r["concurrency"] == c]
        cats = list(dict.fromkeys(k for r in sel for k in r.get("decode_tok_s_by_category", {}))) + ["all"]
        fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(cats) * len(sel) / 2), 4))
        width = 0.8 / len(sel)
        for j, r in enumerate(sel):
            vals = [r["decode_tok_s_by_category"].get(k) or 0 for k in cats[:-1]] + [r["decode_tok_s_p50"] or 0]
            ax.bar([i + j * width for i in range(len(cats))], vals, width, label=r["endpoint"])
        ax.set_xticks([i + width * (len(sel) - 1) / 2 for i in range(len(cats))], cats, rotation=20)
        ax.set_ylabel("decode tok/s per request (median)")
        ax.set_title(f"concurrency {c}")
        _legend(ax, fontsize=7)
        names.append(_save(fig, out / f"decode_by_category_c{c}.png"))
        plt.close(fig)
    return names
