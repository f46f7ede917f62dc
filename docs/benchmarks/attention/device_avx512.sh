#!/usr/bin/env bash
# On a machine whose CPU has AVX-512 (here: the GPU machine's host CPU, torch as installed there): build specdec._C
# in place, run the kernel tests (every compiled attention path against ATen, rows alone against rows in blocks,
# tree rows against chain rows, the prefix cache's bit-exact reuse), then the attention benchmark on 2 threads for
# the AVX-512 and AVX2 paths. Writes $OUT/avx512-tests.log and $OUT/avx512-bench.txt.
set -uo pipefail
OUT=${OUT:-docs/benchmarks/attention}
source docs/benchmarks/device_env.sh
{
    lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(avx512[a-z_0-9 ]*\).*/AVX-512: yes/'
    grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
    MAX_JOBS=16 python3 setup.py -q build_ext --inplace 2>&1 | grep -E "error|Error" || true
    python3 -c 'from specdec.models import cpu_ops; print("compiled paths:", cpu_ops.ops_paths())'
    OMP_NUM_THREADS=2 python3 -m pytest -p no:cacheprovider -q -m "not real_models and not cuda" \
        tests/test_cpu_ops.py tests/test_trees.py tests/test_prefix_cache.py tests/test_model.py
} 2>&1 | tee "$OUT/avx512-tests.log"
for impl in avx512 avx2; do
    python3 -m specdec.bench.attention --threads 2 --impl $impl --reps 3
done 2>&1 | tee "$OUT/avx512-bench.txt"
