#!/usr/bin/env bash
# Through the server: Qwen2.5-Coder-1.5B (int4) with speculation off, drafted for by its own family's 0.5B (method
# draft) and by Gemma 3 270M (another tokenizer: method cross_vocab), three `specdec serve` processes side by side,
# `specdec bench serve` interleaved (prompt i to every server before prompt i + 1, each request once the machine is
# idle), concurrency 1, greedy, 128 tokens. Every server is told its method server-wide, so `auto` chooses nothing.
#
#   bash docs/benchmarks/cross-vocab/serve.sh [OUT]   (OUT defaults to docs/benchmarks/cross-vocab/<cpu kind>/serve)
# DATASET (default builtin,long:4: 10 built-in prompts and 4 of 1.5k-2.4k tokens), ROUNDS (default 1).
# Needs `pip install -e '.[models,gemma]'`.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source docs/benchmarks/cpu_kind.sh
OUT=${1:-docs/benchmarks/cross-vocab/$(cpu_kind)/serve}
DATASET=${DATASET:-builtin,long:4}
ROUNDS=${ROUNDS:-1}
pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop_all EXIT
wait_up() { for _ in $(seq 900); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; echo "$1 never came up" >&2; exit 1; }
mkdir -p "$OUT"
{ lscpu | grep -m1 'Model name'; grep -m1 'cpu family' /proc/cpuinfo; grep -m1 '^model\s' /proc/cpuinfo; \
  echo "flags: $(grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"; \
  git rev-parse --short HEAD; } > "$OUT/machine.txt"
.venv/bin/specdec serve --port 8050 --speculative-config '{"method": "none"}' > "$OUT/plain.log" 2>&1 & pids+=($!)
.venv/bin/specdec serve --port 8051 --speculative-config '{"method": "draft", "num_speculative_tokens": 4}' \
  > "$OUT/draft-0.5b.log" 2>&1 & pids+=($!)
.venv/bin/specdec serve --port 8052 --draft gemma3-270m \
  --speculative-config '{"method": "cross_vocab", "num_speculative_tokens": 4}' > "$OUT/cross-vocab-gemma.log" 2>&1 &
pids+=($!)
for p in 8050 8051 8052; do wait_up "http://127.0.0.1:$p"; done
.venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds "$ROUNDS" --endpoint http://127.0.0.1:8050 --label plain \
  --endpoint http://127.0.0.1:8051 --label draft-0.5b \
  --endpoint http://127.0.0.1:8052 --label cross-vocab-gemma \
  --out "$OUT"
for p in 8051 8052; do curl -s "http://127.0.0.1:$p/v1/speculative/status" > "$OUT/status-$p.json"; done
stop_all
