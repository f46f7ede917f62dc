#!/usr/bin/env bash
# Do the shipped learned heads pay inside `auto`? (issue 57 item 3) Through the server, concurrency 1, greedy, 128
# tokens, each request sent to an idle machine, prompt i to every server before prompt i + 1, two rounds:
#   llama-server plain (the reference), specdec serve with speculation off, specdec serve's auto without heads
#   (--spec-heads none) and with the shipped EAGLE-3 and Medusa heads (HEADS, default: no flag, which loads them
#   since 57's change; at 3a7a758 the run named them with --spec-heads eagle3,medusa).
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash docs/benchmarks/heads-default/run.sh [OUT]
#
# OUT defaults to docs/benchmarks/heads-default/<cpu kind>; DATASET (default builtin,long:8), ROUNDS (default 2).
# SPECDEC (default .venv/bin/specdec) may name another checkout's command, to time a commit apart from the tree.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/heads-default/$(cpu_kind)}
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
specdec_up 8122 "$OUT/specdec-no-heads.log" --spec-heads none
specdec_up 8120 "$OUT/specdec-heads.log" ${HEADS:-}
for p in 8121 8124 8122 8120; do wait_up "http://127.0.0.1:$p"; done
.venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds "$ROUNDS" \
  --endpoint http://127.0.0.1:8121 --label llama-server \
  --endpoint http://127.0.0.1:8124 --label specdec-off \
  --endpoint http://127.0.0.1:8122 --label specdec-no-heads \
  --endpoint http://127.0.0.1:8120 --label specdec-heads \
  --out "$OUT"
curl -s http://127.0.0.1:8120/v1/speculative/status > "$OUT/specdec-heads-status.json"
curl -s http://127.0.0.1:8122/v1/speculative/status > "$OUT/specdec-no-heads-status.json"
stop_all
