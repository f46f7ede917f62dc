#!/usr/bin/env bash
# Through the server: speculation off, `specdec serve` with no flags from another checkout (OLD: its specdec
# command; here a worktree at 058334a, lookup's record before), and from this one; `bench serve` interleaved,
# idle-gated, c1, greedy, 128 tokens, two rounds, builtin,long:8.
#
#   OLD=/path/to/old/specdec bash docs/benchmarks/lookup-depth/served-ab.sh OUT
#
# OLD for a worktree: `PYTHONPATH=<worktree> exec <this .venv>/bin/python -P -m specdec.cli "$@"`. Without -P,
# `python -m` puts the working directory (this checkout: the script runs from its root) ahead of PYTHONPATH, and the
# "old" server imports this checkout's code.
set -euo pipefail
OUT=$(realpath -m "$1")
cd "$(dirname "$0")/../../.."
source docs/benchmarks/servers.sh
machine_txt
specdec_up 8073 "$OUT/specdec-off.log" --speculative-config '{"method": "none"}'
SPECDEC=${OLD:?OLD: the specdec command of the checkout to compare with} specdec_up 8081 "$OUT/specdec-before.log"
specdec_up 8082 "$OUT/specdec-after.log"
.venv/bin/specdec bench serve --dataset "${DATASET:-builtin,long:8}" --max-tokens 128 --temperature 0 --concurrency 1 \
  --rounds 2 --endpoint http://127.0.0.1:8073 --label off --endpoint http://127.0.0.1:8081 --label before \
  --endpoint http://127.0.0.1:8082 --label after --out "$OUT"
