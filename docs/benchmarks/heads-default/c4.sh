#!/usr/bin/env bash
# Concurrency 4 with and without the shipped heads: `specdec serve` (heads loaded under auto) against
# `specdec serve --spec-heads none`, interleaved rounds of 4 requests, builtin,long:8, greedy, 128 tokens.
#
#   bash docs/benchmarks/heads-default/c4.sh [OUT]      (OUT defaults to docs/benchmarks/heads-default/<cpu kind>-c4)
#
# SPECDEC (default .venv/bin/specdec) may name another checkout's command, to time a commit apart from the tree.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/heads-default/$(cpu_kind)-c4}
SPECDEC=${SPECDEC:-.venv/bin/specdec}
mkdir -p "$OUT"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait' EXIT
$SPECDEC serve --port 8140 > "$OUT/specdec-heads.log" 2>&1 & pids+=($!)
$SPECDEC serve --port 8142 --spec-heads none > "$OUT/specdec-no-heads.log" 2>&1 & pids+=($!)
for p in 8140 8142; do
  for _ in $(seq 900); do curl -sf "http://127.0.0.1:$p/health" >/dev/null && break; sleep 1; done
done
git rev-parse --short HEAD > "$OUT/commit.txt"
.venv/bin/specdec bench serve --dataset builtin,long:8 --max-tokens 128 --temperature 0 --concurrency 4 \
  --endpoint http://127.0.0.1:8142 --label specdec-no-heads \
  --endpoint http://127.0.0.1:8140 --label specdec-heads --out "$OUT"
