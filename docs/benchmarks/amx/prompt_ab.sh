#!/usr/bin/env bash
# First-token time of long prompts, this checkout's build against another's, alternating processes, each round
# after the machine is idle: bash docs/benchmarks/amx/prompt_ab.sh OLD_CHECKOUT [ROUNDS] > out.txt
# OLD_CHECKOUT: a checkout with its kernels built in place (python setup.py build_ext --inplace).
set -euo pipefail
OLD=$1; ROUNDS=${2:-3}
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
PY=$HERE/.venv/bin/python
for r in $(seq 1 "$ROUNDS"); do
  for side in old new; do
    "$PY" -c "from specdec.bench.idle import wait_until_idle; wait_until_idle()"
    tree=$HERE; [ "$side" = old ] && tree=$OLD
    echo "round $r $side $(cd "$HERE" && PYTHONPATH=$tree "$PY" "$HERE/docs/benchmarks/amx/prompt_time.py" 2>/dev/null | tail -1)"
  done
done
