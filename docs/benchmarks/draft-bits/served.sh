#!/usr/bin/env bash
# The draft's MLP at 3 bits through the server: `specdec serve` with no flags (its MLP at 4 bits) and with
# `--speculative-config '{"method": "auto", "draft_mlp_bits": 3}'`, beside speculation off; `bench serve`
# interleaved, idle-gated, c1, greedy, 128 tokens, two rounds, held-out-style prompts with long ones.
#
#   bash docs/benchmarks/draft-bits/served.sh OUT
set -euo pipefail
OUT=$(realpath -m "$1")
cd "$(dirname "$0")/../../.."
source docs/benchmarks/servers.sh
machine_txt
specdec_up 8061 "$OUT/specdec-mlp4.log"
specdec_up 8062 "$OUT/specdec-mlp3.log" --speculative-config '{"method": "auto", "draft_mlp_bits": 3}'
specdec_up 8063 "$OUT/specdec-off.log" --speculative-config '{"method": "none"}'
.venv/bin/specdec bench serve --dataset "${DATASET:-builtin,long:8}" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds 2 --endpoint http://127.0.0.1:8063 --label off --endpoint http://127.0.0.1:8061 --label auto-mlp4 \
  --endpoint http://127.0.0.1:8062 --label auto-mlp3 --out "$OUT"
