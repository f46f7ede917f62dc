"""Suffix decoding chosen alone by auto, against the other variants' runs of the same prompts: reads the per-request
results of an in-process A/B (docs/benchmarks/step-clock/ab.py's results.json: rows of round, prompt, variant,
method, decode_tok_s) and, for every prompt some variant ran with suffix decoding alone and another with something
else, prints both speedups over speculation off's run of that prompt.

    python docs/benchmarks/suffix-alone/paired.py docs/benchmarks/step-clock/amd-zen4/results.json
"""
import collections
import json
import statistics
import sys


def main(path: str) -> None:
    rows = json.load(open(path))["rows"]
    off = {(r["round"], r["prompt"]): r["decode_tok_s"] for r in rows if r["variant"] == "none"}
    runs = collections.defaultdict(list)
    for r in rows:
        if r["variant"] != "none":
            runs[(r["round"], r["prompt"], r["category"])].append((r["method"], r["decode_tok_s"] / off[r["round"],
                                                                                                       r["prompt"]]))
    ratios = []
    for (rnd, prompt, cat), got in sorted(runs.items()):
        alone = [s for m, s in got if m == "suffix"]
        others = [(m, s) for m, s in got if m != "suffix"]
        if alone and others:
            ratios.append(statistics.mean(alone) / statistics.mean(s for _, s in others))
            print(f"round {rnd} prompt {prompt} ({cat}): suffix alone {', '.join(f'{s:.2f}x' for s in alone)}; "
                  f"others {', '.join(f'{m} {s:.2f}x' for m, s in others)}")
    print(f"\nsuffix alone / the others' mean, per prompt: median {statistics.median(ratios):.2f} over {len(ratios)} "
          f"prompts, below 1 on {sum(x < 1 for x in ratios)}")


if __name__ == "__main__":
    main(sys.argv[1])
