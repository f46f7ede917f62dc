"""The compiled CPU kernels (specdec._C): the one place that imports them, on first use.

Two kinds of callers: those with an eager fallback (the decoder's fused ops in models/cpu_ops.py, the bf16 linear)
ask `extension()` and get None without the kernels; those without one (int4 and int8 blocks) call `load_kernels()`,
which raises a SpecDecError saying how to get them.
"""
from __future__ import annotations

import importlib

from ...errors import SpecDecError

_ext = None        # specdec._C once imported; False once its import failed; None: not tried yet
_missing = ""      # why the import failed


def extension():
    """specdec._C, or None when it is not installed (the caller falls back to eager PyTorch)."""
    global _ext, _missing
    if _ext is None:
        try:
            _ext = importlib.import_module("specdec._C")
        except ImportError as exc:
            _ext, _missing = False, str(exc)
    return _ext or None


def load_kernels():
    """specdec._C, or a SpecDecError saying why it is missing and how to get it."""
    ext = extension()
    if ext is None:
        raise SpecDecError(
            "int4 quantization needs specdec's compiled CPU kernels (specdec._C), which are not "
            f"installed ({_missing}). They are built by `pip install -e .` when a C++ compiler (g++ or "
            "clang++) is present: install one and reinstall, or use --quantization none / int8."
        )
    return ext


def available() -> bool:
    return extension() is not None


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16; AMX CPUs have it too), as specdec._C sees it."""
    return available() and bool(load_kernels().has_avx512_bf16())


IMPLS = {"auto": 0, "portable": 1, "avx512": 2, "avx2": 3, "amx": 4}


def vector_kernel(bits: int, group: int = 32) -> bool:
    """Whether this CPU runs codes of `bits` in groups of `group` on a vector kernel (AVX-512 VNNI or AVX2), not
    the portable scalar one: the compiled dispatch rule, asked."""
    return available() and bool(load_kernels().vector_kernel(bits, group))
