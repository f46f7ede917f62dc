"""`report.md` for `bench offline`: headline tables, a recommendation per category, peers, memory, parity.

The recommendation is a pure function of the summary rows, so the report can never disagree with its
own numbers: a speculative config is eligible when its outputs are long enough to amortise it and (for a
draft model, whose drafting costs forward passes) its acceptance is at least 0.4; the fastest eligible
config is recommended when it beats plain decoding by at least ENABLE_MIN_SPEEDUP.
"""
from __future__ import annotations

from ..config import AUTO, PLAIN
from ..proposers.registry import METHOD_TABLE
from .summary import ALL

ENABLE_MIN_SPEEDUP = 1.10      # below this a single run on a shared machine cannot tell a win from noise
MIN_ACCEPTANCE = 0.40          # a draft model accepted less than this wastes its forward passes
MIN_OUTPUT_TOKENS = 32         # shorter outputs: prefill dominates and speculation has no time to pay
# A speedup can only come from committing more than one token per target forward; a config that does not
# (tokens_per_forward < ENABLE_MIN_SPEEDUP) is ruled out whatever its timing says.


def spec_methods() -> tuple[str, ...]:
    """Every declared method that speculates, and each tree method's `-tree` label (bench offline's runs)."""
    return tuple(m.name for m in METHOD_TABLE.values() if m.kind != "plain") + tuple(
        f"{m.name}-tree" for m in METHOD_TABLE.values() if m.tree)


def _free(method: str) -> bool:
    m = METHOD_TABLE.get(method)
    return m is not None and m.free


def _reads_draft_model(method: str) -> bool:
    m = METHOD_TABLE.get(method)
    return m is not None and m.needs == "draft_model"


def _rows(summary, **match):
    return [r for r in summary if all(r.get(k) == v for k, v in match.items())]


def _categories(summary) -> list[str]:
    cats = list(dict.fromkeys(r["category"] for r in summary if r["category"] != ALL))
    return cats + [ALL] if len(cats) > 1 else cats


def _temperatures(summary) -> list[float]:
    return sorted({r["temperature"] for r in summary})


def recommend(summary: list[dict]) -> list[dict]:
    """One decision per (category, temperature): enable or not, method, k, expected speedup and why."""
    out = []
    for temp in _temperatures(summary):
        for cat in _categories(summary):
            base = _rows(summary, method=PLAIN, category=cat, temperature=temp)
            spec = spec_methods()
            cands = [r for r in summary if r["category"] == cat and r["temperature"] == temp
                     and r["method"] in spec and r.get("speedup") is not None]
            dec = {"category": cat, "temperature": temp, "enable": False, "method": PLAIN, "k": 0,
                   "expected_speedup": 1.0}
            if not cands:
                out.append({**dec, "why": "no speculative run measured"})
                continue
            excluded = []
            eligible = []
            for r in cands:
                if (r.get("completion_tokens") or 0) < MIN_OUTPUT_TOKENS:
                    excluded.append((r, f"outputs of {r['completion_tokens']:.0f} tokens are too short to amortise it"))
                elif _reads_draft_model(r["method"]) and (r.get("acceptance_rate") or 0) < MIN_ACCEPTANCE:
                    excluded.append((r, f"acceptance {r['acceptance_rate'] or 0:.2f} is below {MIN_ACCEPTANCE}"))
                elif r.get("tokens_per_forward") is not None and r["tokens_per_forward"] < ENABLE_MIN_SPEEDUP:
                    excluded.append((r, f"only {r['tokens_per_forward']:.2f} tokens per target forward, so its "
                                        "measured gain is noise"))
                else:
                    eligible.append(r)
            best = max(eligible, key=lambda r: r["speedup"], default=None)
            notes = []
            if temp > 0:
                cold = [r for r in _rows(summary, category=cat, temperature=min(_temperatures(summary)))
                        if r["method"] in spec and r.get("acceptance_rate") is not None]
                here = [r for r in cands if r.get("acceptance_rate") is not None]
                best_cold = max((r["acceptance_rate"] for r in cold), default=None)
                best_here = max((r["acceptance_rate"] for r in here), default=None)
                if cold and here and best_here < best_cold - 0.02:
                    notes.append(f"temperature {temp:g} lowers the best acceptance from {best_cold:.2f} "
                                 f"to {best_here:.2f}")
            if best is not None and best["speedup"] >= ENABLE_MIN_SPEEDUP:
                why = f"{_label(best)} measured {best['speedup']:.2f}x decode speed"
                if base and best.get("decode_tok_s") and base[0].get("decode_tok_s"):
                    why += f" ({best['decode_tok_s']:.1f} vs {base[0]['decode_tok_s']:.1f} tok/s)"
                if best.get("acceptance_rate") is not None:
                    why += (f", acceptance {best['acceptance_rate']:.2f}, "
                            f"mean accepted length {best['mean_accepted_length']:.2f}")
                if (_free(best["method"]) and best["acceptance_rate"] is not None
                        and best["acceptance_rate"] < MIN_ACCEPTANCE):
                    why += f" (low acceptance is fine here: {best['method']} drafts cost no forward pass)"
                out.append({**dec, "enable": True, "method": best["method"], "k": best["k"],
                            "expected_speedup": best["speedup"], "why": "; ".join([why, *notes])})
                continue
            if best is not None:
                why = (f"best eligible config {_label(best)} gains only {best['speedup']:.3f}x "
                       f"(< {ENABLE_MIN_SPEEDUP:.2f}x)")
            else:
                why = "no config is eligible"
            if excluded:
                r, reason = max(excluded, key=lambda e: e[0]["speedup"])
                why += f"; {_label(r)} ruled out: {reason} ({r['speedup']:.2f}x)"
            out.append({**dec, "why": "; ".join([why, *notes])})
    return out


def _label(r: dict) -> str:
    return f"{r['method']} k={r['k']}" if r["k"] else r["method"]


def _k(r: dict) -> str:
    """k as a table cell; `auto` picks k (and lookup or draft) per step."""
    return "per step" if r["method"] == AUTO else str(r["k"])


def _f(x, fmt="{:.2f}", none="-"):
    return none if x is None else fmt.format(x)


def _best_per_method(summary, cat, temp) -> list[dict]:
    """For each method, its fastest k in this cell."""
    best: dict[str, dict] = {}
    for r in _rows(summary, category=cat, temperature=temp):
        if r.get("decode_tok_s") is None:
            continue
        if r["method"] not in best or r["decode_tok_s"] > best[r["method"]]["decode_tok_s"]:
            best[r["method"]] = r
    return list(best.values())


def _specdec_weights(cfg: dict) -> str:
    """What specdec did with the GGUF's weights under the run's --quantization (models/quantization/__init__.py)."""
    scheme = cfg.get("quantization") or "none"
    if scheme == "int4":
        return ("runs the target's GGUF blocks on its own int4 CPU kernels (specdec._C; Q4_K, Q6_K and Q8_0 "
                "blocks kept without loss)")
    if scheme == "int8":
        return "re-quantizes them to int8 per output channel (weight-only)"
    return f"dequantizes them to {cfg['dtype']}"


def render_report(result: dict, plots: list[str]) -> str:
    cfg, machine, summary = result["config"], result["machine"], result["summary"]
    lines = ["# specdec offline A/B benchmark", ""]
    lines += [f"- target `{cfg['target']}`, draft `{cfg['draft']}`, dtype {cfg['dtype']}, "
              f"{cfg['num_prompts']} prompts from `{cfg['prompts']}`, max_tokens {cfg['max_tokens']}, "
              f"repeats {cfg['repeats']}, seed {cfg['seed']}",
              f"- methods {', '.join(cfg['methods'])}; k {', '.join(map(str, cfg['ks']))}; temperatures "
              f"{', '.join(f'{t:g}' for t in cfg['temperatures'])}; peers {', '.join(cfg['peers']) or 'none'}",
              f"- machine: {machine['cpu']}, {machine['cpu_count']} cores ({machine['threads']} threads), "
              f"torch {machine['torch']}, {machine['date']}, specdec {machine.get('specdec_commit') or '?'}",
              "- speedup = median over prompts of (decode tok/s) / (decode tok/s of `none` on the same prompt, "
              "temperature and seed); one process, warmed up, models loaded once", ""]

    lines += ["## Recommendation", "",
              f"Rules: enable when the fastest eligible config beats plain decoding by ≥ {ENABLE_MIN_SPEEDUP:.2f}x; "
              f"a draft model needs acceptance ≥ {MIN_ACCEPTANCE}; outputs under {MIN_OUTPUT_TOKENS} tokens mean off. "
              "All figures are single-stream (concurrency 1): speculation spends idle compute, so it suits "
              "latency-sensitive, low-concurrency traffic and pays less as load grows.", "",
              "| category | temperature | decision | method | k | expected speedup | why |",
              "|---|---|---|---|---|---|---|"]
    for d in recommend(summary):
        lines.append(f"| {d['category']} | {d['temperature']:g} | {'**enable**' if d['enable'] else 'off'} | "
                     f"{d['method']} | {_k(d)} | {d['expected_speedup']:.2f}x | {d['why']} |")
    lines.append("")

    cats = _categories(summary)
    for temp in _temperatures(summary):
        lines += [f"## Headline, temperature {temp:g} (each method at its fastest k)", "",
                  "decode tok/s · speedup vs `none` · acceptance", "",
                  "| method | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
        methods = list(dict.fromkeys(r["method"] for r in summary))
        for m in methods:
            cells = []
            for cat in cats:
                r = next((x for x in _best_per_method(summary, cat, temp) if x["method"] == m), None)
                if r is None:
                    cells.append("-")
                    continue
                k = f" (k={r['k']})" if r["k"] else ""
                acc = f" · {r['acceptance_rate']:.2f}" if r.get("acceptance_rate") is not None else ""
                cells.append(f"{r['decode_tok_s']:.2f} · {_f(r['speedup'])}x{acc}{k}")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")

    peer_rows = [r for r in summary if r["method"].startswith(("hf-", "llamacpp-"))]
    peer_methods = list(dict.fromkeys(r["method"] for r in peer_rows))
    if peer_rows:
        lines += ["## specdec against the peers", "",
                  "Ratio of specdec's fastest config to each peer's decode tok/s (same prompt tokens, same model "
                  "files; llama.cpp runs the GGUF's 4–6-bit weights natively; transformers keeps them quantized and "
                  f"computes in float32; specdec {_specdec_weights(cfg)}).", "",
                  "| temperature | category | specdec best | " + " | ".join(peer_methods) + " |",
                  "|---|---|---|" + "---|" * len(peer_methods)]
        for temp in _temperatures(summary):
            for cat in cats:
                ours = [r for r in _best_per_method(summary, cat, temp) if r["method"] in (PLAIN, *spec_methods())]
                if not ours:
                    continue
                best = max(ours, key=lambda r: r["decode_tok_s"])
                cells = []
                for pm in peer_methods:
                    p = next((x for x in _rows(summary, method=pm, category=cat, temperature=temp)
                              if x.get("decode_tok_s")), None)
                    cells.append(f"{best['decode_tok_s'] / p['decode_tok_s']:.2f}x (peer {p['decode_tok_s']:.2f} tok/s)"
                                 if p else "error")
                lines.append(f"| {temp:g} | {cat} | {_label(best)} {best['decode_tok_s']:.2f} tok/s | "
                             + " | ".join(cells) + " |")
        lines.append("")

    lines += ["## All configurations", "",
              "| T | category | method | k | n | err | out tok | TTFT ms | TPOT p50/p95/p99 ms | e2e p50/p95/p99 s | "
              "tok/s | speedup | e2e speedup | accept | MAL | per-position acceptance | draft share | draft / fwd | "
              "parity |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        if r.get("decode_tok_s") is None:
            lines.append(f"| {r['temperature']:g} | {r['category']} | {r['method']} | {_k(r)} | {r['n']} | "
                         f"{r['errors']} |" + " - |" * 13)
            continue
        ms = lambda x: _f(x * 1000 if x is not None else None, "{:.0f}")  # noqa: E731
        pos = " ".join(f"{a:.2f}" for a in r["accepted_per_position"]) or "-"
        lines.append(
            f"| {r['temperature']:g} | {r['category']} | {r['method']} | {_k(r)} | {r['n']} | {r['errors']} | "
            f"{_f(r['completion_tokens'], '{:.0f}')} | {ms(r['ttft_s'])} | "
            f"{ms(r['tpot_s'])}/{ms(r['tpot_p95_s'])}/{ms(r['tpot_p99_s'])} | "
            f"{_f(r['e2e_s'])}/{_f(r['e2e_p95_s'])}/{_f(r['e2e_p99_s'])} | {_f(r['decode_tok_s'])} | "
            f"{_f(r['speedup'])}x | {_f(r['e2e_speedup'])}x | {_f(r['acceptance_rate'])} | "
            f"{_f(r['mean_accepted_length'])} | {pos} | {_f(r['draft_overhead'])} | {_f(r.get('draft_step_cost'))} | "
            f"{_f(r['parity_rate'])} |")
    lines.append("")

    mem = cfg["memory"]
    lines += ["## Memory", "",
              f"- target weights {mem['target_weight_bytes'] / 2**20:.0f} MiB; draft weights "
              f"{mem['draft_weight_bytes'] / 2**20:.0f} MiB; draft KV cache "
              f"{mem['draft_kv_bytes_per_token'] / 1024:.1f} KiB per token (max per request: "
              f"{max((r.get('draft_kv_mb') or 0 for r in summary), default=0):.1f} MiB)",
              *(["- learned heads' weights as run: " + "; ".join(
                  f"{m} {h['weight_bytes'] / 2**20:.1f} MiB ({h['quantization']})" for m, h in mem["heads"].items())]
                if mem.get("heads") else []),
              *[f"- {m}'s state after the runs: " + ", ".join(f"{k} {v}" for k, v in section.items() if k != "bytes")
                + f", {section['bytes'] / 2**10:.0f} KiB" for m, section in (mem.get("methods") or {}).items()
                if section.get("bytes")],
              f"- peak RSS of the benchmark process {mem['peak_rss_mb']:.0f} MiB (peers loaded after specdec's runs "
              "add to it)", ""]

    runs = result["runs"]
    spec = spec_methods()
    mism = [r for r in runs if r.get("parity") is False and r["temperature"] == 0 and r["method"] in spec]
    lines += ["## Parity (greedy)", ""]
    greedy_spec = [r for r in runs
                   if r["temperature"] == 0 and r["method"] in spec and r.get("parity") is not None]
    if greedy_spec:
        lines.append(f"- {sum(r['parity'] for r in greedy_spec)}/{len(greedy_spec)} greedy speculative runs are "
                     "token-identical to plain decoding.")
    for r in mism:
        lines.append(f"- prompt {r['prompt_index']} {_label(r)}: differs; target top-2 logit margin at the first "
                     f"differing token {_f(r.get('divergence_margin'), '{:.4f}')} (a near-tie under {cfg['dtype']} "
                     "rounding when small)")
    if any(t > 0 for t in cfg["temperatures"]):
        lines.append("- Sampled runs (temperature > 0) are equal to the target in distribution, not token for token; "
                     "their parity column is left empty.")
    lines.append("")

    errors = [r for r in runs if r.get("error")]
    if errors:
        lines += ["## Errors", ""]
        for r in errors[:20]:
            lines.append(f"- prompt {r['prompt_index']} {_label(r)} T={r['temperature']:g}: {r['error']}")
        if len(errors) > 20:
            lines.append(f"- ... {len(errors) - 20} more in results.json")
        lines.append("")

    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)
