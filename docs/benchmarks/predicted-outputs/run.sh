#!/usr/bin/env bash
# Predicted outputs on code edits: `specdec bench serve --dataset edits:30` (stdlib functions, each with a small
# edit to make; the prediction is the function as sent) through one interleaved run, each round sent once the
# machine is idle: llama.cpp's llama-server (plain) on the same GGUF; `specdec serve` with no flags; the same
# server sent each request's `prediction`. Ratios in the report are to the first endpoint, llama-server.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash docs/benchmarks/predicted-outputs/run.sh [OUT]
#
# LLAMA_BIN defaults to what ../shared/tools/llamacpp_build.sh builds (llama.cpp build 11434). Greedy, 128 tokens,
# concurrency 1. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-docs/benchmarks/predicted-outputs/$(grep -q AuthenticAMD /proc/cpuinfo && echo amd || echo intel)}
N=${N:-30}
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

.venv/bin/specdec serve --port 8030 > "$OUT/specdec-serve.log" 2>&1 & pids+=($!)
"$BIN/llama-server" -m "$TARGET" -t 2 -np 1 -c 8192 --port 8031 > "$OUT/llama-plain.log" 2>&1 & pids+=($!)
for p in 8030 8031; do wait_up "http://127.0.0.1:$p"; done
.venv/bin/specdec bench serve --dataset "edits:$N" --max-tokens 128 --temperature 0 --concurrency 1 \
  --endpoint http://127.0.0.1:8031 --label llama-server \
  --endpoint http://127.0.0.1:8030 --label specdec \
  --endpoint http://127.0.0.1:8030 --label specdec+prediction --prediction specdec+prediction \
  --out "$OUT"
curl -s http://127.0.0.1:8030/v1/speculative/status > "$OUT/specdec-speculative-status.json"
lscpu | grep -m1 'Model name' > "$OUT/machine.txt"
