# Sourced by the benchmark scripts that start servers (after `cd` to the checkout and setting OUT): the servers they
# start are stopped however the script ends; `wait_up URL` waits for /health (15 min at most: a first start converts
# the models); `specdec_up PORT LOG ARGS...` starts `$SPECDEC serve` (default .venv/bin/specdec) and waits until it is up, so
# each server measures its cost model alone (measured beside other servers loading, it steered auto from wrong
# prices; the server now re-measures a disturbed measurement, and waiting here keeps startup short); `machine_txt` writes
# OUT/machine.txt (the CPU, its vector flags, the commit); `default_target` prints the default target's GGUF path.
pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop_all EXIT
wait_up() { for _ in $(seq 900); do curl -sf "$1/health" >/dev/null && return 0; sleep 1; done; echo "$1 never came up" >&2; exit 1; }
specdec_up() {
  local port=$1 log=$2; shift 2
  ${SPECDEC:-.venv/bin/specdec} serve --port "$port" "$@" > "$log" 2>&1 & pids+=($!)
  wait_up "http://127.0.0.1:$port"
}
machine_txt() {
  mkdir -p "$OUT"
  { lscpu | grep -m1 'Model name'; grep -m1 'cpu family' /proc/cpuinfo; grep -m1 '^model\s' /proc/cpuinfo; \
    echo "flags: $(grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"; \
    git rev-parse --short HEAD; } > "$OUT/machine.txt"
}
default_target() {
  .venv/bin/python -c "
from specdec.models.registry import BUILTIN_MODELS, DEFAULT_TARGET, assemble
print(assemble(BUILTIN_MODELS[DEFAULT_TARGET]))"
}
