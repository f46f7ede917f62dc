"""Builds specdec._C, the CPU kernels for block-quantized (int4) linears, with torch's cpp_extension.

Everything else about the package lives in pyproject.toml. Without a C++ compiler the package still
installs (bf16 and int8 keep working) and this script says which compiler it looked for; asking for
`--quantization int4` then fails with the same explanation. SPECDEC_REQUIRE_KERNELS=1 makes a missing
compiler an install error instead.
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
               "clang++): the int4 CPU kernels (specdec._C) are not built; install g++ and reinstall to use "
               "--quantization int4")
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
