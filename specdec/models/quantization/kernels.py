"""The compiled CPU kernels (specdec._C), imported on first use so that bf16 and int8 never need them."""
from __future__ import annotations

import importlib

from ...errors import SpecDecError

_ext = None


def load_kernels():
    """specdec._C, or a SpecDecError saying why it is missing and how to get it."""
    global _ext
    if _ext is None:
        try:
            _C = importlib.import_module("specdec._C")
        except ImportError as exc:
            raise SpecDecError(
                "int4 quantization needs specdec's compiled CPU kernels (specdec._C), which are not "
                f"installed ({exc}). They are built by `pip install -e .` when a C++ compiler (g++ or "
                "clang++) is present: install one and reinstall, or use --quantization none / int8."
            ) from None
        _ext = _C
    return _ext


def available() -> bool:
    try:
        load_kernels()
        return True
    except SpecDecError:
        return False


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16; AMX CPUs have it too), as specdec._C sees it."""
    return available() and bool(load_kernels().has_avx512_bf16())


IMPLS = {"auto": 0, "portable": 1, "avx512": 2, "avx2": 3}


def vector_kernel(bits: int, group: int = 32) -> bool:
    """Whether this CPU runs codes of `bits` in groups of `group` on a vector kernel (AVX-512 VNNI or AVX2), not
    the portable scalar one: the compiled dispatch rule, asked."""
    return available() and bool(load_kernels().vector_kernel(bits, group))
