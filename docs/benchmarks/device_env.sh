# Sourced by the scripts that run on a lent machine from a checkout with no install (cuda/run.sh,
# attention/device_avx512.sh): PyTorch as the machine has it, specdec from the tree (PYTHONPATH), and wheels of the
# few dependencies the machine lacks, in .whl/ when given (`pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl gguf fastapi uvicorn ...` of what is missing).
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
