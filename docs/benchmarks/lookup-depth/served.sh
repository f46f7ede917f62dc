#!/usr/bin/env bash
# `specdec serve` with no flags beside speculation off, with lookup's record as tested: `bench serve` interleaved,
# idle-gated, c1, greedy, 128 tokens, two rounds, held-out-style prompts with long ones.
#
#   bash docs/benchmarks/lookup-depth/served.sh OUT
set -euo pipefail
OUT=$(realpath -m "$1")
cd "$(dirname "$0")/../../.."
source docs/benchmarks/servers.sh
machine_txt
specdec_up 8071 "$OUT/specdec-defaults.log"
specdec_up 8073 "$OUT/specdec-off.log" --speculative-config '{"method": "none"}'
.venv/bin/specdec bench serve --dataset "${DATASET:-builtin,long:8}" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds 2 --endpoint http://127.0.0.1:8073 --label off --endpoint http://127.0.0.1:8071 --label defaults \
  --out "$OUT"
