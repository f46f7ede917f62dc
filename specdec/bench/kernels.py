"""`python -m specdec.bench.kernels`: ms per forward of a 1.5B-shaped linear stack, per kernel and row count.

The stack is Qwen2.5-1.5B's: 28 x [qkv 1536->2048, o 1536->1536, gate_up 1536->17920, down 8960->1536]
plus the output head 1536->151936, applied to M rows (a decode step is M = 1; verifying k drafts is
M = k + 1). Weights are random (kernel time does not depend on values); one method's stack is built,
timed and freed before the next, so peak memory is one stack. V(M) = t(M) / t(1) is the cost of an
M-row forward in one-row forwards: what speculation must beat.

Methods: bf16 (oneDNN packed, rows padded to 6; its bf16 path needs AVX-512), bf16-ours (specdec._C's bf16 kernel,
the default for bf16: AVX-512 BF16, else AVX2 + FMA), aten-int4 (`_weight_int4pack_mm_for_cpu`, group 32),
aten-int8 (`_weight_int8pack_mm`, per channel), ours (specdec._C, 4-bit group 32 as built from Q4_K),
ours-q6 (the same kernel on 6-bit codes in 16-k groups: how the GGUF's Q6_K tensors are held exactly), ours-q8
(8-bit codes in 32-k groups, one scale each: Q8_0's shape, and the heads' int8 blocks), ours-portable
(`ours` on the scalar kernel), ours-vnni / ours-amx (`ours` on one kernel whatever M; -q6, -q8: on Q6_K's and
Q8_0's shapes). `ours` runs the AMX kernel from 28 rows on (Q4_K and Q6_K shapes) where the CPU has AMX-INT8, else the
AVX-512 VNNI kernel, else the AVX2 one.
"""
from __future__ import annotations

import argparse
import gc
import time

import torch

LAYERS = 28
LAYER_SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]   # (out, in) per linear
HEAD = (151936, 1536)


def stack_shapes(layers: int = LAYERS) -> list[tuple[int, int]]:
    return LAYER_SHAPES * layers + [HEAD]


def _bf16(n, k):
    from ..models.packed_linear import PackedLinear

    return PackedLinear(torch.randn(n, k, dtype=torch.bfloat16) * 0.02, None)


def _bf16_ours(n, k):
    from ..models.packed_linear import Bf16Linear

    return Bf16Linear(torch.randn(n, k, dtype=torch.bfloat16) * 0.02, None)


def _aten_int4(n, k, group=32):
    q = torch.randint(0, 16, (n, k), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 8)
    sz = torch.rand(k // group, n, 2, dtype=torch.bfloat16) * 0.01          # scales and zeros
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)


def _aten_int8(n, k):
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    s = torch.rand(n, dtype=torch.bfloat16) * 0.01
    return lambda x: torch.ops.aten._weight_int8pack_mm(x, w, s)


def _ours(n, k, bits=4, group=32, sb=8):
    from ..models.quantization.blocks import PackedBlocks
    from ..models.quantization.linear import BlockQuantLinear

    nb, ng = n // 16, k // group
    ns = -(-ng // sb)
    p = PackedBlocks(torch.randint(0, 256, (nb, ng, group * 2 * bits), dtype=torch.uint8),
                     torch.randint(0, 64, (nb, ng, 16), dtype=torch.int8),
                     torch.randint(0, 64, (nb, ng, 16), dtype=torch.int8),
                     (torch.rand(nb, ns, 2, 16) * 1e-3).half(), bits, group, sb, n)
    return BlockQuantLinear(p, None)


def _ours_impl(impl: str, **fmt):
    def build(n, k):
        lin = _ours(n, k, **fmt)
        lin.impl = impl            # one kernel whatever the row count (`ours` picks by CPU and rows)
        return lin
    return build


METHODS = {
    "bf16": _bf16,
    "bf16-ours": _bf16_ours,
    "aten-int4": _aten_int4,
    "aten-int8": _aten_int8,
    "ours": _ours,
    "ours-q6": lambda n, k: _ours(n, k, bits=6, group=16, sb=16),
    "ours-q8": lambda n, k: _ours(n, k, bits=8, group=32, sb=1),
    "ours-portable": _ours_impl("portable"),   # the scalar kernel: what a CPU without a vector path runs
    "ours-vnni": _ours_impl("avx512"),
    "ours-amx": _ours_impl("amx"),             # AMX-INT8 tiles (Intel Xeon from Sapphire Rapids on)
    "ours-q6-vnni": _ours_impl("avx512", bits=6, group=16, sb=16),
    "ours-q6-amx": _ours_impl("amx", bits=6, group=16, sb=16),
    "ours-q8-vnni": _ours_impl("avx512", bits=8, group=32, sb=1),
    "ours-q8-amx": _ours_impl("amx", bits=8, group=32, sb=1),
}


def time_stack(method: str, rows: list[int], reps: int, layers: int = LAYERS) -> dict[int, float]:
    """Best-of-`reps` ms per forward of the stack for each M in rows.

    The row counts are interleaved within each repetition (not `reps` runs of one M, then the next), so
    a burst of load from another process on a shared machine spoils one sample of many M, not all
    samples of one M; the minimum then stands for the quiet machine.
    """
    shapes = stack_shapes(layers)
    linears = [METHODS[method](n, k) for n, k in shapes]
    xs = {k: torch.randn(max(rows), k, dtype=torch.bfloat16) for k in {k for _, k in shapes}}
    best = {m: float("inf") for m in rows}
    with torch.inference_mode():
        for rep in range(reps + 1):               # the first pass warms caches and allocators
            for m in rows:
                t0 = time.perf_counter()
                for (_, k), lin in zip(shapes, linears):
                    lin(xs[k][:m])
                if rep:
                    best[m] = min(best[m], time.perf_counter() - t0)
    del linears
    gc.collect()
    return {m: t * 1e3 for m, t in best.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specdec.bench.kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="bf16,aten-int4,aten-int8,ours", help=f"comma list of {', '.join(METHODS)}")
    ap.add_argument("--rows", default=",".join(str(m) for m in range(1, 17)), help="comma list of M")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=LAYERS, help="fewer layers for a quick look (head kept)")
    ap.add_argument("--prefetch", type=int, default=None, help="our kernel's software prefetch distance in bytes")
    args = ap.parse_args(argv)
    if args.prefetch is not None:
        from ..models.quantization.kernels import load_kernels

        load_kernels().set_prefetch_distance(args.prefetch)
    rows = [int(v) for v in args.rows.split(",")]
    methods = args.methods.split(",")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per {args.layers}-layer forward, "
          f"best of {args.reps}")
    results = {}
    for method in methods:
        try:
            results[method] = time_stack(method, rows, args.reps, args.layers)
        except RuntimeError as exc:            # e.g. oneDNN's bf16 path on a CPU without AVX-512
            print(f"  {method}: not available on this CPU ({str(exc).splitlines()[0]})", flush=True)
            continue
        print(f"  {method}: " + " ".join(f"{m}:{t:.1f}" for m, t in results[method].items()), flush=True)
    methods = [m for m in methods if m in results]
    head = "| M | " + " | ".join(methods) + " | " + " | ".join(f"V {m}" for m in methods) + " |"
    print("\n" + head + "\n|" + "---|" * (1 + 2 * len(methods)))
    for m in rows:
        ts = [results[meth][m] for meth in methods]
        vs = [results[meth][m] / results[meth][rows[0]] for meth in methods]
        print(f"| {m} | " + " | ".join(f"{t:.1f}" for t in ts) + " | " + " | ".join(f"{v:.2f}" for v in vs) + " |")


if __name__ == "__main__":
    main()
