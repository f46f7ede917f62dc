"""The compiled CPU kernels (specdec._C): the one place that imports them, on first use.

Two kinds of callers: those with an eager fallback (the decoder's fused ops in models/cpu_ops.py, the bf16 linear)
ask `extension()` and get None without the kernels; those without one (int4 and int8 blocks) call `load_kernels()`,
which raises a SpecDecError saying how to get them.
"""
from __future__ import annotations

import importlib
import os

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
        else:
            use_cpu_allocator(_ext)
    return _ext or None


def use_cpu_allocator(ext) -> bool:
    """Make PyTorch's CPU allocator the extension's, which keeps freed blocks for the next request of their size
    (csrc/cpu_allocator.cpp: a one-token step allocates a few hundred small tensors, and glibc's posix_memalign was
    ~3% of a draft step on the thread the other waits for). SPECDEC_CPU_ALLOCATOR=system keeps PyTorch's own."""
    choice = os.environ.get("SPECDEC_CPU_ALLOCATOR", "reuse")
    if choice not in ("reuse", "system"):
        raise SpecDecError(f"SPECDEC_CPU_ALLOCATOR must be 'reuse' or 'system', got {choice!r}")
    return choice == "reuse" and bool(ext.use_reusing_cpu_allocator())


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
