#!/usr/bin/env bash
# OpenVINO GenAI beside specdec on the same CPU (issue 61), in process: openvino_bench.py (its docstring says how).
#
#   bash docs/benchmarks/peers/openvino.sh [OUT]
#
# OpenVINO lives in its own venv (OV_ENV, default OUT/env: never a dependency of specdec): torch 2.13.0+cpu from the
# local wheel, openvino-genai 2026.4.1.0 and optimum-intel (torchvision removed). Its models are OpenVINO IR with int4 weights, exported by
# optimum-intel (`optimum-cli export openvino --weight-format int4`, NNCF's data-free int4 compression) from bf16 HF
# directories that transformers dequantises from the same GGUF files specdec runs (hf_dir.py; HF_DIR / DRAFT_DIR may
# name existing ones). DATASET (default builtin,long:4), ROUNDS (default 1).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/peers/openvino-$(cpu_kind)}
OV_ENV=${OV_ENV:-$OUT/env}
HF_DIR=${HF_DIR:-$OUT/qwen-1.5b-hf}
DRAFT_DIR=${DRAFT_DIR:-$OUT/qwen-0.5b-hf}
IR=${IR:-$OUT/ir}
PY=.venv/bin/python
mkdir -p "$OUT"
if [ ! -x "$OV_ENV/bin/python" ]; then
  python3.11 -m venv "$OV_ENV"
  "$OV_ENV/bin/pip" install torch==2.13.0 openvino-genai==2026.4.1.0 "optimum-intel[openvino]"
  # the torchvision pip brings beside torch 2.13.0+cpu fails to import (torchvision::nms), and transformers with it
  "$OV_ENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
fi
[ -f "$HF_DIR/config.json" ] || $PY docs/benchmarks/peers/hf_dir.py "$HF_DIR"
[ -f "$DRAFT_DIR/config.json" ] || $PY docs/benchmarks/peers/hf_dir.py "$DRAFT_DIR" --model draft
for pair in "target:$HF_DIR" "draft:$DRAFT_DIR"; do
  name=${pair%%:*}; src=${pair#*:}
  [ -f "$IR/$name/openvino_model.xml" ] || "$OV_ENV/bin/optimum-cli" export openvino --model "$src" \
    --task text-generation-with-past --weight-format int4 "$IR/$name"
done
source docs/benchmarks/servers.sh
machine_txt
"$OV_ENV/bin/pip" show openvino-genai optimum-intel | awk '/^(Name|Version)/{printf "%s ", $2} END {print ""}' >> "$OUT/machine.txt"
$PY docs/benchmarks/peers/openvino_bench.py "$OV_ENV/bin/python" "$IR/target" "$IR/draft" "$OUT" \
  --dataset "${DATASET:-builtin,long:4}" --rounds "${ROUNDS:-1}"
