"""How much of the target's own greedy answers the first N tokens of the ranking hold: every `none` run's output
tokens in the results.json files under docs/benchmarks (answers the ranking never saw).

    .venv/bin/python docs/benchmarks/draft-vocab/coverage.py
"""
import collections
import glob
import json

from specdec.proposers.draft_vocab import load_ranking, ranking_path

TARGET = "qwen2.5-coder-1.5b-instruct"
counts, answers = collections.Counter(), 0
for path in glob.glob("docs/benchmarks/**/results.json", recursive=True):
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, ValueError):
        continue
    if results.get("config", {}).get("target") not in (None, TARGET):
        continue
    for run in results.get("runs", []):
        if run.get("method") == "none" and run.get("token_ids"):
            counts.update(run["token_ids"])
            answers += 1
total = sum(counts.values())
ranked = load_ranking(ranking_path(TARGET)).tolist()
print(f"{answers} answers, {total} tokens, {len(counts)} distinct")
for n in (4096, 8192, 16384, 32768, 65536):
    kept = set(ranked[:n])
    print(f"first {n}: {sum(c for t, c in counts.items() if t in kept) / total:.4f} of the answers' tokens")
