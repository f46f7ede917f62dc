"""Builds specdec._C, specdec's CPU kernels, with torch's cpp_extension: the block-quantized linears (int4 weights,
int8/int4 heads; csrc/qlinear_*.cpp), the bf16 linear (csrc/bf16_linear.cpp) and the decoder's fused steps:
residual + RMSNorm, rotary embedding, SiLU-and-multiply (csrc/ops.cpp) and ragged attention (csrc/attention.cpp).

Everything else about the package lives in pyproject.toml. Without a C++ compiler the package still
installs (bf16 and int8 keep working, slower: on PyTorch's own linears and eager ops) and this script says
which compiler it looked for; asking for `--quantization int4` then fails with the same explanation.
SPECDEC_REQUIRE_KERNELS=1 makes a missing compiler an install error instead.
"""
import os
import shutil
import sys

from setuptools import setup


def find_compiler() -> str | None:
    cxx = os.environ.get("CXX", "c++")
    return shutil.which(cxx.split()[0]) or shutil.which("g++") or shutil.which("clang++")


def extensions():
    if find_compiler() is None:
        msg = (f"specdec: no C++ compiler found (looked for $CXX={os.environ.get('CXX', '')!r}, c++, g++, "
               "clang++): specdec's CPU kernels (specdec._C) are not built; install g++ and reinstall to use "
               "--quantization int4 (bf16 and int8 then run slower, on PyTorch's own linears and ops)")
        if os.environ.get("SPECDEC_REQUIRE_KERNELS") == "1":
            raise SystemExit(msg)
        print(f"WARNING: {msg}", file=sys.stderr)
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext = CppExtension(
        "specdec._C",
        ["csrc/bindings.cpp", "csrc/ops.cpp", "csrc/attention.cpp", "csrc/bf16_linear.cpp", "csrc/qlinear_portable.cpp", "csrc/qlinear_avx512.cpp",
         "csrc/qlinear_avx2.cpp"],
        # -fopenmp: at::parallel_for is header code; without it the kernel runs on one thread.
        # -ffp-contract=off: the portable kernel must round exactly where the AVX-512 kernel does.
        extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off"],
        extra_link_args=["-fopenmp"],
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=False)}


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
