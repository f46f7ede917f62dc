"""From a `bench serve` results.json whose first endpoint is speculation off: each other endpoint's time to first token
on the prompts over 900 tokens against off's, its answers identical to off's, the methods auto ran by category and the
requests that moved to the draft.

    python docs/benchmarks/suffix-alone/summary.py docs/benchmarks/suffix-alone/served-amd-zen4/results.json
"""
import collections
import json
import statistics
import sys

d = json.load(open(sys.argv[1]))
R = collections.defaultdict(dict)
for r in d["requests"]:
    R[int(r["prompt_index"])][r["endpoint"]] = r
eps = [e for e in d["config"]["labels"]]
off = eps[0]
for e in eps[1:]:
    long = [float(v[e]["ttft_s"]) / float(v[off]["ttft_s"]) for v in R.values() if int(v[off]["prompt_tokens"]) > 900]
    same = sum(v[e]["text"] == v[off]["text"] for v in R.values())
    ran = collections.Counter()
    moved = 0
    for v in R.values():
        s = v[e]["speculative"]
        s = s if isinstance(s, dict) else (json.loads(s) if s and s != "None" else {})
        ran[(v[e]["category"], s.get("method"))] += 1
        moved += "moved to" in (s.get("policy_reason") or "")
    print(f"{e}: TTFT over 900-token prompts / off's: median {statistics.median(long):.3f} "
          f"[{min(long):.2f} - {max(long):.2f}] (n {len(long)}); identical {same}/{len(R)}; moved {moved}")
    print("   ran:", ", ".join(f"{c} {m} x{n}" for (c, m), n in sorted(ran.items(), key=str)))
