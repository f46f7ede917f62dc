#!/usr/bin/env bash
# Prefix caching, six-turn conversations: specdec serve without the cache (--no-enable-prefix-caching), specdec serve
# (defaults: the cache on), and llama.cpp's own llama-server (its slot prompt cache on by default) on the same GGUF,
# in one interleaved run of `specdec bench serve --turns 6` (ratios and "identical" against the first endpoint,
# specdec without the cache: the greedy-parity check). Then the same conversations back to back (no think time,
# no interleaving: an agent loop's next call sent the moment the last answer ends), on fresh server processes.
# Last, shared-prefix: 400 requests behind one ~1k-token system prompt, 4 at a time, to specdec serve with
# --max-total-tokens 8192 (far less than the 400 requests' K/V: entries are evicted LRU), its RSS sampled each second.
# PHASE=interleaved, back-to-back or shared-prefix runs one of them.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash docs/benchmarks/prefix-cache/run.sh [OUT]
#
# LLAMA_BIN: see docs/benchmarks/serve-vs-llamacpp/run.sh (what ../shared/tools/llamacpp_build.sh builds). Run it
# on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-docs/benchmarks/prefix-cache}
PY=.venv/bin/python
BIN=${LLAMA_BIN:-$(bash ../shared/tools/llamacpp_build.sh)}
TARGET=$($PY -c "
from specdec.models.registry import BUILTIN_MODELS, DEFAULT_TARGET, assemble
print(assemble(BUILTIN_MODELS[DEFAULT_TARGET]))")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_up() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; echo "$1 never came up" >&2; exit 1; }
mkdir -p "$OUT"

start_servers() {    # fresh processes: nothing cached from an earlier phase
  .venv/bin/specdec serve --port 8020 > "$OUT/specdec-serve-$1.log" 2>&1 & pids+=($!)
  wait_up http://127.0.0.1:8020      # one at a time: the first start may measure the cost model
  .venv/bin/specdec serve --port 8024 --no-enable-prefix-caching > "$OUT/specdec-nocache-$1.log" 2>&1 & pids+=($!)
  "$BIN/llama-server" -m "$TARGET" -t 2 -np 1 -c 8192 --port 8021 > "$OUT/llama-server-$1.log" 2>&1 & pids+=($!)
  for p in 8024 8021; do wait_up "http://127.0.0.1:$p"; done
}
ENDPOINTS=(--endpoint http://127.0.0.1:8024 --label specdec-nocache
           --endpoint http://127.0.0.1:8020 --label specdec
           --endpoint http://127.0.0.1:8021 --label llama-server)
PHASE=${PHASE:-all}
if [[ $PHASE == all || $PHASE == interleaved ]]; then
  start_servers interleaved
  .venv/bin/specdec bench serve --turns 6 --dataset builtin --max-tokens 96 --temperature 0 --think-time 2 \
    "${ENDPOINTS[@]}" --out "$OUT/interleaved"
  curl -s http://127.0.0.1:8020/metrics | grep prefix_cache > "$OUT/interleaved/specdec-prefix-metrics.txt"
  curl -s http://127.0.0.1:8020/v1/speculative/status > "$OUT/interleaved/specdec-speculative-status.json"
  cleanup; pids=()
fi
if [[ $PHASE == all || $PHASE == back-to-back ]]; then
  start_servers back-to-back
  .venv/bin/specdec bench serve --turns 6 --dataset builtin --max-tokens 96 --temperature 0 --no-interleave \
    "${ENDPOINTS[@]}" --out "$OUT/back-to-back"
  cleanup; pids=()
fi
if [[ $PHASE == all || $PHASE == shared-prefix ]]; then
  mkdir -p "$OUT/shared-prefix"
  .venv/bin/specdec serve --port 8020 --max-total-tokens 8192 > "$OUT/specdec-serve-shared-prefix.log" 2>&1 &
  server=$!; pids+=($server)
  wait_up http://127.0.0.1:8020
  while kill -0 "$server" 2>/dev/null; do awk '/VmRSS/ {print $2}' "/proc/$server/status"; sleep 1; done \
    > "$OUT/shared-prefix/specdec-rss-kib.txt" & pids+=($!)
  .venv/bin/specdec bench serve --dataset shared-prefix:400 --concurrency 4 --max-tokens 32 --temperature 0 \
    --endpoint http://127.0.0.1:8020 --label specdec --out "$OUT/shared-prefix"
  curl -s http://127.0.0.1:8020/metrics | grep prefix_cache > "$OUT/shared-prefix/specdec-prefix-metrics.txt"
  curl -s http://127.0.0.1:8020/v1/speculative/status > "$OUT/shared-prefix/specdec-speculative-status.json"
fi
