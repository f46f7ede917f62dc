#!/usr/bin/env bash
# auto on ShareGPT prose through the server, before and after weighing a first try by its evidence: `specdec serve`
# with no flags at OLD_REV (a worktree, its kernels built in place, run through PYTHONPATH) and at this checkout,
# beside this checkout with speculation off; `bench serve` interleaved, idle-gated, c1, greedy, 128 tokens.
#
#   bash docs/benchmarks/policy-auto/prior-weight/served.sh OLD_REV OUT
set -euo pipefail
OLD_REV=$1 OUT=$(realpath -m "$2")
cd "$(dirname "$0")/../../../.."
ROOT=$PWD OLD=/tmp/specdec-pre
[ -d "$OLD" ] || git worktree add -f "$OLD" "$OLD_REV"
(cd "$OLD" && "$ROOT/.venv/bin/python" setup.py -q build_ext --inplace >/dev/null 2>&1)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
up() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; exit 1; }
mkdir -p "$OUT"
(cd "$OLD" && PYTHONPATH=$OLD exec "$ROOT/.venv/bin/python" -m specdec.cli serve --port 8062) > "$OUT/specdec-old.log" 2>&1 & pids+=($!)
up http://127.0.0.1:8062
.venv/bin/specdec serve --port 8061 > "$OUT/specdec-new.log" 2>&1 & pids+=($!)
up http://127.0.0.1:8061
.venv/bin/specdec serve --port 8063 --speculative-config '{"method": "none"}' > "$OUT/specdec-off.log" 2>&1 & pids+=($!)
up http://127.0.0.1:8063
.venv/bin/specdec bench serve --dataset "${DATASET:-sharegpt:16}" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds 2 --endpoint http://127.0.0.1:8063 --label off --endpoint http://127.0.0.1:8062 --label "auto-$OLD_REV" \
  --endpoint http://127.0.0.1:8061 --label auto-new --out "$OUT"
