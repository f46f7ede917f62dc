#!/usr/bin/env bash
# auto against the fixed methods it chooses between, through the server (issue 57 item 7, served half): concurrency
# 1, greedy, 128 tokens, each request sent to an idle machine, prompt i to every server before prompt i + 1:
#   llama-server plain (the reference), specdec serve with speculation off, with prompt lookup (ngram k=4), with the
#   draft model (draft k=4), and with no flags (auto, the shipped heads loaded).
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash docs/benchmarks/auto-vs-fixed/served.sh [OUT]
#
# OUT defaults to docs/benchmarks/auto-vs-fixed/served-<cpu kind>; DATASET (default builtin,long:8), ROUNDS (2).
# SPECDEC (default .venv/bin/specdec) may name another checkout's command, to time a commit apart from the tree.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/auto-vs-fixed/served-$(cpu_kind)}
DATASET=${DATASET:-builtin,long:8}
ROUNDS=${ROUNDS:-2}
PY=.venv/bin/python
SPECDEC=${SPECDEC:-.venv/bin/specdec}
BIN=${LLAMA_BIN:-$(bash ../shared/tools/llamacpp_build.sh)}
source docs/benchmarks/servers.sh
TARGET=$(default_target)
machine_txt
"$BIN/llama-server" -m "$TARGET" -t 2 --port 8121 -np 1 -c 8192 > "$OUT/llama-plain.log" 2>&1 & pids+=($!)
specdec_up 8124 "$OUT/specdec-off.log" --speculative-config '{"method": "none"}'
specdec_up 8125 "$OUT/specdec-ngram.log" --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'
specdec_up 8126 "$OUT/specdec-draft.log" --speculative-config '{"method": "draft", "num_speculative_tokens": 4}'
specdec_up 8120 "$OUT/specdec-auto.log"
for p in 8121 8124 8125 8126 8120; do wait_up "http://127.0.0.1:$p"; done
.venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds "$ROUNDS" \
  --endpoint http://127.0.0.1:8121 --label llama-server \
  --endpoint http://127.0.0.1:8124 --label specdec-off \
  --endpoint http://127.0.0.1:8125 --label specdec-ngram \
  --endpoint http://127.0.0.1:8126 --label specdec-draft \
  --endpoint http://127.0.0.1:8120 --label specdec-auto \
  --out "$OUT"
curl -s http://127.0.0.1:8120/v1/speculative/status > "$OUT/specdec-auto-status.json"
stop_all
