#!/bin/bash
# concurrency 4, the session's head against 6dddb68 (the session's start), both `specdec serve` with no flags
set -e
cd /work/main
PYTHONPATH=/tmp/old .venv/bin/python -m specdec.cli serve --port 8052 > /tmp/c4ba/specdec-6dddb68.log 2>&1 &
p1=$!
for i in $(seq 600); do curl -sf http://127.0.0.1:8052/health >/dev/null && break; sleep 1; done
.venv/bin/specdec serve --port 8051 > /tmp/c4ba/specdec-head.log 2>&1 &
p2=$!
for i in $(seq 600); do curl -sf http://127.0.0.1:8051/health >/dev/null && break; sleep 1; done
.venv/bin/specdec bench serve --dataset builtin,long:8 --max-tokens 128 --temperature 0 --concurrency 4 \
  --endpoint http://127.0.0.1:8052 --label specdec-6dddb68 \
  --endpoint http://127.0.0.1:8051 --label specdec-head \
  --out /tmp/c4ba
kill $p1 $p2; wait 2>/dev/null || true
