"""lm-eval's runs against speculation off and the defaults (run.sh's OUT): scores, and every sample's response,
side by side; exits 1 when anything differs.

    .venv/bin/python docs/benchmarks/lm-eval/compare.py docs/benchmarks/lm-eval/amd-zen4
"""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
same = True
for task in ("choice", "gen"):
    runs = {}
    for label in ("off", "defaults"):
        base = out / f"{label}-{task}"
        res = json.loads(sorted(base.rglob("results_*.json"))[-1].read_text())
        samples = [json.loads(x) for f in sorted(base.rglob("samples_*.jsonl")) for x in f.read_text().splitlines()]
        runs[label] = (res["results"], {s["doc_id"]: s["resps"] for s in samples})
    (r_off, s_off), (r_def, s_def) = runs["off"], runs["defaults"]
    differ = [d for d in s_off if s_off[d] != s_def.get(d)]
    print(f"{task}: off {json.dumps(r_off)}\n{task}: defaults {json.dumps(r_def)}")
    print(f"{task}: {len(s_off)} samples, {len(s_off) - len(differ)} identical responses, scores "
          f"{'identical' if r_off == r_def else 'DIFFER'}")
    same &= not differ and r_off == r_def
sys.exit(0 if same else 1)
