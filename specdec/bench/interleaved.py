"""Variants of one in-process `LLM` against each other, interleaved: each prompt runs every variant before the next
prompt, the variants' order rotated per prompt and round, so the minutes a shared machine spends slow weigh on every
variant alike; figures are ratios to a base variant's on the same prompt in the same round. What the `ab.py` scripts
under docs/benchmarks share; each brings its variants (a callable that runs one request) and its report's columns.
"""
from __future__ import annotations

import collections
import json
import statistics
from collections.abc import Callable
from pathlib import Path


def request_figures(out) -> dict:
    """One finished request's figures: tokens, first token and whole-request seconds, decode speed (the tokens after
    the first over the time after the first), and its text."""
    s = out.stats
    n = len(out.token_ids)
    return {"tokens": n, "ttft_s": s.ttft_s, "e2e_s": s.e2e_s,
            "decode_tok_s": (n - 1) / (s.e2e_s - s.ttft_s) if n > 1 and s.e2e_s > s.ttft_s else None,
            "text": out.text}


def interleave(prompts: list[dict], ids: list[list[int]], variants: list[str], rounds: int,
               run: Callable[[list[int], str, str], dict]) -> list[dict]:
    """Every prompt through every variant, ROUNDS times: run(prompt ids, variant, salt) -> the request's figures,
    salt naming the round ("r1", ...). Each row is printed as it comes (its text left out)."""
    rows = []
    for r in range(rounds):
        for i, (p, pid) in enumerate(zip(prompts, ids)):
            shift = (i + r) % len(variants)
            for v in variants[shift:] + variants[:shift]:
                row = {"round": r + 1, "prompt": i, "category": p["category"], "variant": v,
                       **run(pid, v, f"r{r + 1}")}
                rows.append(row)
                print(json.dumps({k: x for k, x in row.items() if k != "text"}), flush=True)
    return rows


def ratio_medians(rows: list[dict], variants: list[str], key: str, better: Callable[[float, float], float],
                  base: str = "none") -> list[tuple[str, int, dict[str, float]]]:
    """Per category (in order of appearance), then "all": (category, requests of the base variant, {variant: median
    over its requests of better(its key, the base's key on the same prompt and round)})."""
    ref = {(r["round"], r["prompt"]): r[key] for r in rows if r["variant"] == base}
    out = []
    for c in list(dict.fromkeys(r["category"] for r in rows)) + ["all"]:
        mine = [r for r in rows if c in ("all", r["category"])]
        out.append((c, sum(1 for r in mine if r["variant"] == base),
                    {v: statistics.median(better(r[key], ref[r["round"], r["prompt"]]) for r in mine
                                          if r["variant"] == v) for v in variants}))
    return out


def same_text(rows: list[dict], base: str = "none") -> tuple[int, int]:
    """(requests whose text equals the base variant's on the same prompt and round, requests of other variants)."""
    ref = {(r["round"], r["prompt"]): r["text"] for r in rows if r["variant"] == base}
    others = [r for r in rows if r["variant"] != base]
    return sum(1 for r in others if r["text"] == ref[r["round"], r["prompt"]]), len(others)


def ratio_table(rows: list[dict], variants: list[str], key: str, better: Callable[[float, float], float],
                extra: list[tuple[str, Callable[[dict[str, float]], float]]] = ()) -> list[str]:
    """A markdown table of ratio_medians against variants[0]: per category, each other variant's median ratio, then
    the `extra` columns, each (title, f(the category's {variant: median ratio})), e.g. after over before."""
    lines = ["| category (requests) | " + " | ".join([*variants[1:], *(t for t, _ in extra)]) + " |",
             "|---|" + "---|" * (len(variants) - 1 + len(extra))]
    for c, n, s in ratio_medians(rows, variants, key, better, base=variants[0]):
        cells = [f"{s[v]:.2f}x" for v in variants[1:]] + [f"{f(s):.2f}" for _, f in extra]
        lines.append(f"| {c} ({n}) | " + " | ".join(cells) + " |")
    return lines


def methods_ran(rows: list[dict], variant: str) -> str:
    """What a variant's requests ran, by category: "code-gen draft x2, ..."."""
    ran = collections.Counter(f"{r['category']} {r['method']}" for r in rows if r["variant"] == variant)
    return ", ".join(f"{k} x{n}" for k, n in sorted(ran.items()))


def save(out: Path, payload: dict, report: str) -> None:
    """A run's rows and settings to OUT/results.json, its report to OUT/report.md, and the report printed."""
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    (out / "report.md").write_text(report)
    print(report)


def speed_tables(rows: list[dict], table: Callable[[list[dict], str, Callable], list[str]], decode_note: str = "",
                 e2e_note: str = "") -> list[str]:
    """A report's two tables, each by table(rows, key, better): decode speed over speculation off's, then its request
    time over the variant's (end to end); a note may follow either heading's wording."""
    return (["Decode speed (tokens after the first over the time after the first), over speculation off's"
             f"{decode_note}:", "", *table(rows, "decode_tok_s", lambda x, b: x / b), "",
             f"End to end (speculation off's request time over the variant's{e2e_note}):", "",
             *table(rows, "e2e_s", lambda x, b: b / x)])
