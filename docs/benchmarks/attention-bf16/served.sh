#!/usr/bin/env bash
# `specdec serve` with no flags beside speculation off, after the bf16 attention: `bench serve` interleaved,
# idle-gated, c1, greedy, 128 tokens, two rounds, held-out-style prompts with long ones.
#
#   bash docs/benchmarks/attention-bf16/served.sh OUT
set -euo pipefail
OUT=$(realpath -m "$1")
cd "$(dirname "$0")/../../.."
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
up() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; exit 1; }
mkdir -p "$OUT"
.venv/bin/specdec serve --port 8071 > "$OUT/specdec-defaults.log" 2>&1 & pids+=($!)
up http://127.0.0.1:8071
.venv/bin/specdec serve --port 8073 --speculative-config '{"method": "none"}' > "$OUT/specdec-off.log" 2>&1 & pids+=($!)
up http://127.0.0.1:8073
.venv/bin/specdec bench serve --dataset "${DATASET:-builtin,long:8}" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds 2 --endpoint http://127.0.0.1:8073 --label off --endpoint http://127.0.0.1:8071 --label defaults \
  --out "$OUT"
