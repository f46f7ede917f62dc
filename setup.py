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
from concurrent.futures import ThreadPoolExecutor

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
        # torch_ops.cpp includes bindings, ops, attention and bf16_linear: one parse of torch's headers for the four
        ["csrc/torch_ops.cpp", "csrc/qlinear_portable.cpp", "csrc/qlinear_avx512.cpp", "csrc/qlinear_avx2.cpp",
         "csrc/qlinear_amx.cpp", "csrc/attention_amx.cpp"],
        # -fopenmp: at::parallel_for is header code; without it the kernel runs on one thread.
        # -ffp-contract=off: the portable kernel must round exactly where the AVX-512 kernel does.
        # -g0: Python's own flags ask for debug info, a third of torch_ops.cpp's compile time (62 s -> 39 s on two
        # Zen 4 cores) for nothing a user runs; symbols stay for perf.
        extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off", "-g0"],
        extra_link_args=["-fopenmp"],
        # the headers and the sources torch_ops.cpp includes: an edit of one rebuilds the extension (distutils
        # compares only these and the sources above with the built library)
        depends=sorted(os.path.join("csrc", f) for f in os.listdir("csrc") if f.endswith((".h", ".cpp"))),
    )
    class ParallelBuild(BuildExtension):
        """Compiles the extension's sources on every core: the default compiles them one after another (without
        ninja, which would be one more build dependency), and the AVX-512 sources alone take a minute each."""

        def build_extensions(self):
            compile_parallel(self.compiler)
            super().build_extensions()

    return [ext], {"build_ext": ParallelBuild.with_options(use_ninja=False)}


def compile_parallel(compiler) -> None:
    """Replace compiler.compile (distutils' CCompiler) with the same steps, one thread per source file: each
    thread runs g++ in a subprocess. `_compile` is looked up at call time, so BuildExtension's wrapper of it (the
    flags it adds per source) still applies."""
    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
        todo = [obj for obj in objects if obj in build]

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(max(1, min(len(todo), os.cpu_count() or 1))) as pool:
            list(pool.map(one, todo))
        return objects

    compiler.compile = compile


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
