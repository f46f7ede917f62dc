#!/usr/bin/env bash
# Concurrency 4 before and after the bf16 attention: `specdec serve` (defaults) of another checkout (OLD: its
# specdec command, e.g. a clone at e6d46a9 with its own .venv and extension) against this one, interleaved rounds
# of 4 concurrent requests, builtin,long:8, greedy, 128 tokens, two rounds.
#
#   OLD=/path/to/old/.venv/bin/specdec bash docs/benchmarks/attention-bf16/c4.sh OUT
set -euo pipefail
OUT=$(realpath -m "$1")
cd "$(dirname "$0")/../../.."
source docs/benchmarks/servers.sh
machine_txt
SPECDEC=${OLD:?OLD: the specdec command of the checkout to compare with} specdec_up 8081 "$OUT/specdec-before.log"
specdec_up 8082 "$OUT/specdec-after.log"
.venv/bin/specdec bench serve --dataset builtin,long:8 --max-tokens 128 --temperature 0 --concurrency 4 --rounds 2 \
  --endpoint http://127.0.0.1:8081 --label before --endpoint http://127.0.0.1:8082 --label after --out "$OUT"
