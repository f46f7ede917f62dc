#!/usr/bin/env bash
# The CUDA tests (pytest -m cuda) on a machine with a GPU, from a checkout with no install: PyTorch as the machine
# has it, specdec from the tree (PYTHONPATH; its CPU kernels are not built: on CUDA the eager code runs), and
# wheels of the few pure-Python dependencies the machine lacks in .whl/ when given (pip download, see README.md).
# Writes $OUT/cuda-tests.log (OUT defaults to docs/benchmarks/cuda/).
set -uo pipefail
OUT=${OUT:-docs/benchmarks/cuda}
source docs/benchmarks/device_env.sh
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
    git rev-parse --short HEAD 2>/dev/null
    python3 -m pytest -m cuda -p no:cacheprovider -rA -q tests/test_cuda.py tests/test_batching.py
} 2>&1 | tee "$OUT/cuda-tests.log"
