"""The server's per-token overhead: decode tok/s of the same prompts through `specdec serve` (a `bench serve`
results.json) against `bench offline` on the same config (its results.json), per prompt.

    python -m specdec.bench.overhead OFFLINE/results.json SERVE/results.json [--method none] [--label L]

Prints, per category and over all prompts, the median of (served decode tok/s / offline decode tok/s) over the
prompts both runs completed; 1 - that ratio is the overhead. Offline figures are the median over its repeats
of one method at one k (`--method`, `--k`); served ones the request's decode speed at concurrency 1.
"""
from __future__ import annotations

import argparse
import json
import sys

from ..config import PLAIN
from .summary import median


def paired_ratios(offline: dict, served: dict, method: str, k: int | None,
                  label: str | None) -> list[tuple[str, float]]:
    """(category, served / offline decode tok/s) per prompt both runs completed."""
    runs = [r for r in offline["runs"] if r["method"] == method and (k is None or r["k"] == k)
            and r.get("decode_tok_s") and r.get("temperature", 0) == 0]
    by_prompt: dict[int, list[float]] = {}
    cats: dict[int, str] = {}
    for r in runs:
        by_prompt.setdefault(r["prompt_index"], []).append(r["decode_tok_s"])
        cats[r["prompt_index"]] = r["category"]
    reqs = [r for r in served["requests"] if r["ok"] and r.get("decode_tok_s") and r["concurrency"] == 1
            and (label is None or r["endpoint"] == label)]
    out = []
    for r in reqs:
        off = median(by_prompt.get(r["prompt_index"], []))
        if off:
            out.append((cats[r["prompt_index"]], r["decode_tok_s"] / off))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("offline")
    p.add_argument("served")
    p.add_argument("--method", default=PLAIN, help="the offline method the server ran")
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--label", default=None, help="the bench serve endpoint label (default: every endpoint)")
    args = p.parse_args(argv)
    try:
        offline, served = (json.load(open(path)) for path in (args.offline, args.served))
    except (OSError, ValueError) as exc:
        print(f"overhead: error: {exc}", file=sys.stderr)
        return 1
    pairs = paired_ratios(offline, served, args.method, args.k, args.label)
    if not pairs:
        print("overhead: error: no prompt completed in both runs (same --prompts / --dataset?)", file=sys.stderr)
        return 1
    print("| category | prompts | served / offline decode tok/s (median) | overhead |")
    print("|---|---|---|---|")
    for cat in [*dict.fromkeys(c for c, _ in pairs), "all"]:
        xs = [x for c, x in pairs if cat in ("all", c)]
        m = median(xs)
        print(f"| {cat} | {len(xs)} | {m:.3f} | {(1 - m) * 100:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
