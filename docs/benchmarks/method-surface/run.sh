#!/usr/bin/env bash
# Every method `specdec serve` lists in /v1/speculative/status, asked for per request on the real pair (the shipped
# EAGLE-3 and Medusa heads loaded beside the default auto): status 200 and the same greedy text as method none.
#
#   bash docs/benchmarks/method-surface/run.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-docs/benchmarks/method-surface}
mkdir -p "$OUT"
.venv/bin/specdec serve --port 8040 --spec-heads eagle3,medusa > "$OUT/specdec-serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf http://127.0.0.1:8040/health >/dev/null && break; sleep 1; done
.venv/bin/python - "$OUT" <<'PY'
import json, sys, httpx
out = sys.argv[1]
url = "http://127.0.0.1:8040"
status = httpx.get(url + "/v1/speculative/status", timeout=30).json()
rows = []
for m in status["methods"]:
    body = {"messages": [{"role": "user", "content": "Write a Python function that checks whether a string is a "
                          "palindrome."}], "max_tokens": 48, "temperature": 0,
            "speculative": {"method": m["method"]}}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    j = r.json()
    rows.append({"method": m["method"], "kind": m["kind"], "status": r.status_code,
                 "ran": (j.get("speculative") or {}).get("method"),
                 "text": j["choices"][0]["message"]["content"] if r.status_code == 200 else j})
plain = next(r["text"] for r in rows if r["method"] == "none")
lines = ["| method | kind | HTTP | ran as | same text as none |", "|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['method']} | {r['kind']} | {r['status']} | {r['ran']} | {r['text'] == plain} |")
open(f"{out}/results.json", "w").write(json.dumps({"status": status, "rows": rows}, indent=1))
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
