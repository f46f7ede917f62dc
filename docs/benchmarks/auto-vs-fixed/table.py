"""The README's table for one served.sh run: median decode tok/s per category (llama-server plain and speculation off
as tok/s, the rest over off), auto over the best fixed choice, e2e over off; then auto over off per round, the first
token of the prompts over 1k tokens against off's, and the method auto ran per category.

    python docs/benchmarks/auto-vs-fixed/table.py docs/benchmarks/auto-vs-fixed/served-<kind>/results.json
"""
import collections
import json
import statistics
import sys

ENDPOINTS = ["llama-server", "specdec-off", "specdec-ngram", "specdec-draft", "specdec-auto"]
FIXED = {"off": "specdec-off", "ngram": "specdec-ngram", "draft": "specdec-draft"}


def main(path: str) -> None:
    reqs = [r for r in json.load(open(path))["requests"] if r["ok"] and r["concurrency"] == 1]

    def med(ep, cat, key, rnd=None):
        return statistics.median(r[key] for r in reqs if r["endpoint"] == ep and cat in ("all", r["category"])
                                 and rnd in (None, r["round"]) and r.get(key))

    print("| category | llama plain | off | ngram | draft | **auto** | auto / best fixed | e2e over off: ngram, draft, "
          "**auto** |\n|---|---|---|---|---|---|---|---|")
    for cat in sorted({r["category"] for r in reqs}) + ["all"]:
        tok = {e: med(e, cat, "decode_tok_s") for e in ENDPOINTS}
        e2e = {e: med(e, cat, "e2e_s") for e in ENDPOINTS}
        off = tok["specdec-off"]
        best = max(FIXED, key=lambda m: tok[FIXED[m]])
        ratio = tok["specdec-auto"] / tok[FIXED[best]]
        over = lambda e: e2e["specdec-off"] / e2e[e]  # noqa: E731
        print(f"| {cat} | {tok['llama-server']:.2f} | {off:.2f} | {tok['specdec-ngram'] / off:.2f}x | "
              f"{tok['specdec-draft'] / off:.2f}x | **{tok['specdec-auto'] / off:.2f}x** | {ratio:.2f}"
              f"{'' if ratio >= 1 else f' ({best})'} | {over('specdec-ngram'):.2f}x, {over('specdec-draft'):.2f}x, "
              f"**{over('specdec-auto'):.2f}x** |")
    for rnd in sorted({r["round"] for r in reqs}):
        print(f"round {rnd + 1}: auto over off {med('specdec-auto', 'all', 'decode_tok_s', rnd) / med('specdec-off', 'all', 'decode_tok_s', rnd):.2f}x, "
              f"off over llama-server {med('specdec-off', 'all', 'decode_tok_s', rnd) / med('llama-server', 'all', 'decode_tok_s', rnd):.2f}x")
    ttft = collections.defaultdict(dict)
    for r in reqs:
        if r["prompt_tokens"] > 1000:
            ttft[(r["prompt_index"], r["round"])][r["endpoint"]] = r["ttft_s"]
    for ep in ("specdec-ngram", "specdec-draft", "specdec-auto"):
        xs = sorted(v[ep] / v["specdec-off"] for v in ttft.values())
        print(f"first token of the {len(xs)} prompts over 1k tokens, {ep} over off: median {statistics.median(xs):.3f} "
              f"[{xs[0]:.3f} - {xs[-1]:.3f}]")
    ran = collections.Counter((r["category"], (r.get("speculative") or {}).get("method"))
                              for r in reqs if r["endpoint"] == "specdec-auto")
    print("auto ran: " + ", ".join(f"{c} {m} x{n}" for (c, m), n in sorted(ran.items(), key=str)))


if __name__ == "__main__":
    main(sys.argv[1])
