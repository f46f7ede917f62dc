"""Medians of prompt_ab.sh's output by prompt length: old, new, old / new, and the ratio per round.

    python docs/benchmarks/amx/prompt_ab_table.py docs/benchmarks/amx/prompt-ab-intel-amx.txt
"""
import json
import statistics
import sys
from collections import defaultdict

runs = defaultdict(lambda: defaultdict(list))          # (side, tokens) -> round -> seconds
for line in open(sys.argv[1]):
    _, rnd, side, rest = line.split(" ", 3)
    rec = json.loads(rest)
    for t, s in zip(rec["tokens"], rec["seconds"]):
        runs[side, t][rnd].append(s)
for t in sorted({t for _, t in runs}):
    old = [s for v in runs["old", t].values() for s in v]
    new = [s for v in runs["new", t].values() for s in v]
    per_round = [statistics.median(runs["old", t][r]) / statistics.median(runs["new", t][r]) for r in runs["new", t]]
    print(f"{t} tokens: old {statistics.median(old):.2f} s, new {statistics.median(new):.2f} s, "
          f"old / new {statistics.median(old) / statistics.median(new):.2f}x "
          f"(rounds {', '.join(f'{x:.2f}' for x in per_round)})")
