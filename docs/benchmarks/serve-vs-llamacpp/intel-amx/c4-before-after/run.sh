#!/usr/bin/env bash
# Concurrency 4: `specdec serve` (no flags) of this checkout against an older commit's, the same 18 prompts
# (builtin,long:8), both servers started one after the other (each measures its cost model on a quiet machine).
#
#   bash docs/benchmarks/serve-vs-llamacpp/intel-amx/c4-before-after/run.sh OLD_REV OUT [head-first]
#
# The old commit is checked out in a worktree (/tmp/specdec-old), its kernels built in place, and run from it
# through PYTHONPATH with this checkout's .venv. run1 here: `run.sh 6dddb68 <this folder>/run1`; run2: `run.sh
# 6dddb68 <this folder>/run2 head-first` (the endpoints' order swapped).
set -euo pipefail
OLD_REV=$1 OUT=$(realpath -m "$2") ORDER=${3:-old-first}
cd "$(dirname "$0")/../../../../.."
ROOT=$PWD OLD=/tmp/specdec-old
[ -d "$OLD" ] || git worktree add -f "$OLD" "$OLD_REV"
(cd "$OLD" && "$ROOT/.venv/bin/python" setup.py -q build_ext --inplace >/dev/null)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
up() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; exit 1; }
mkdir -p "$OUT"
# -P: `python -m` puts the working directory (this checkout) on sys.path before PYTHONPATH; without it the "old"
# server of run1 and run2 imported this checkout's specdec (see the README)
PYTHONPATH=$OLD .venv/bin/python -P -m specdec.cli serve --port 8052 > "$OUT/specdec-old.log" 2>&1 & pids+=($!)
up http://127.0.0.1:8052
.venv/bin/specdec serve --port 8051 > "$OUT/specdec-head.log" 2>&1 & pids+=($!)
up http://127.0.0.1:8051
old=(--endpoint http://127.0.0.1:8052 --label "specdec-$OLD_REV")
head=(--endpoint http://127.0.0.1:8051 --label specdec-head)
if [ "$ORDER" = head-first ]; then eps=("${head[@]}" "${old[@]}"); else eps=("${old[@]}" "${head[@]}"); fi
.venv/bin/specdec bench serve --dataset builtin,long:8 --max-tokens 128 --temperature 0 --concurrency 4 \
  "${eps[@]}" --out "$OUT"
