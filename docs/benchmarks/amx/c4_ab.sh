#!/usr/bin/env bash
# specdec serve with no flags at concurrency 4: this checkout against another's build (issue 57's "concurrency 4
# does not lose"), both servers up at once and `specdec bench serve` sending each round to one, then the other:
#
#   bash docs/benchmarks/amx/c4_ab.sh OLD_CHECKOUT [OUT]
#
# OLD_CHECKOUT: a checkout with its kernels built in place (python setup.py build_ext --inplace), run with this
# checkout's .venv. DATASET (default builtin,long:4), ROUNDS (default 2).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OLD=$1
source docs/benchmarks/cpu_kind.sh
OUT=${2:-docs/benchmarks/amx/c4-$(cpu_kind)}
DATASET=${DATASET:-builtin,long:4}
ROUNDS=${ROUNDS:-2}
source docs/benchmarks/servers.sh
machine_txt
git -C "$OLD" rev-parse --short HEAD | sed 's/^/before: /' >> "$OUT/machine.txt"
SPECDEC="env PYTHONPATH=$OLD .venv/bin/specdec" specdec_up 8131 "$OUT/specdec-before.log"
specdec_up 8130 "$OUT/specdec-after.log"
.venv/bin/specdec bench serve --dataset "$DATASET" --max-tokens 128 --temperature 0 --concurrency 4 \
  --rounds "$ROUNDS" --endpoint http://127.0.0.1:8131 --label before --endpoint http://127.0.0.1:8130 --label after \
  --out "$OUT"
