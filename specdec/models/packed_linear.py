"""Linear layers with weights pre-packed at load time for CPU.

bf16 on CPU: `Bf16Linear`, specdec._C's own kernel (csrc/bf16_linear.cpp) with AVX-512 BF16, or with AVX2 + FMA
on CPUs without it (AMD Zen 2/3, Intel client cores). It reads the weights once per call for a few rows and
computes every row alone in a fixed order, so a row's result never depends on the batch (no padding needed).
Measured on the 1.5B's linears (`python -m specdec.bench.kernels --methods bf16,bf16-ours`): see
docs/benchmarks/README.md.

Otherwise (fp32, or specdec._C not built): `PackedLinear`, oneDNN's packed matmul, below, where oneDNN runs the
dtype on this CPU (`onednn_packs`; its bf16 path needs AVX-512), else the model keeps its plain linears.

A plain `F.linear` on CPU re-lays-out the weight for oneDNN on every call, which roughly halves the
bandwidth a decode step gets from memory. Packing once at load time (what inductor's weight freezing
does) lets a bf16 decode step stream the weights at close to the machine's read bandwidth.

bf16 inputs of fewer than MIN_ROWS rows are zero-padded to MIN_ROWS. Measured on the 2-core EPYC with the
1.5B's layer shapes: oneDNN streams a packed bf16 weight at ~32 GB/s for one row but ~41 GB/s for 5-6
rows (its one-row kernel is a different, slower path), and every row count (1..400 measured) gives bit-identical
results per row. Padding therefore makes a one-token step faster *and* computes each row exactly as a
(k+1)-token verification forward does.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from .hugepages import in_huge_pages


def can_pack(weight: torch.Tensor) -> bool:
    """Whether pack_linear has a batch-invariant CPU kernel for this weight: ours (bf16), else oneDNN's packed
    matmul where this CPU runs it for the dtype."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float32):
        return False
    return bf16_kernel_available(weight) or onednn_packs(weight.dtype)


@functools.cache
def onednn_packs(dtype: torch.dtype) -> bool:
    """oneDNN's packed matmul exists and runs `dtype` on this CPU. Its bf16 path needs AVX-512 (BW, VL, DQ) or
    AVX-NE-CONVERT: on an AVX2-only CPU (AMD Zen 2/3) packing a bf16 weight raises, so it is tried once, small."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 1)
    except RuntimeError:
        return False
    return True


MIN_ROWS = 6
# Attention keys are padded (masked) to a multiple of this: CPU flash attention then sums each row in
# the same order whatever the number of query rows (measured: no mismatches at 64, some at 32).
KEY_BLOCK = 64


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)  # opaque oneDNN layout
        # float32: oneDNN's one-row path rounds differently from its 2..400-row path (measured: rows of M >= 2 are
        # bit-identical, M = 1 is not), so one row is padded to two and every batch size gives the same rows
        self.min_rows = MIN_ROWS if weight.dtype == torch.bfloat16 else 2
        self.bias = None if bias is None else bias.detach().clone()
        self.nbytes = weight.nbytes + (0 if bias is None else bias.nbytes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features]
        x2 = x.reshape(-1, self.in_features)
        rows = x2.shape[0]
        if rows < self.min_rows:
            x2 = torch.cat([x2, x2.new_zeros(self.min_rows - rows, self.in_features)])
        out = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [None], "")
        return out[:rows].view(*x.shape[:-1], self.out_features)


def _bf16_ext():
    """specdec._C when it is built and this CPU runs its bf16 kernel (AVX-512 BF16, else AVX2 + FMA), else None."""
    from .quantization.kernels import available, load_kernels

    if not available():
        return None
    ext = load_kernels()
    return ext if getattr(ext, "has_bf16_linear", lambda: False)() else None


def bf16_kernel_available(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and _bf16_ext() is not None


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] bf16 -> [ceil(N/32), K/2, 32, 2]: per 32 output columns and pair of k, 128 contiguous bytes (the
    operands of two vdpbf16ps); N zero-padded to a multiple of 32."""
    n, k = weight.shape
    if k % 2:
        raise ValueError(f"the bf16 kernel needs an even in_features, got {k}")
    nb = -(-n // 32)
    w = weight.detach().contiguous()
    if nb * 32 != n:
        w = torch.cat([w, w.new_zeros(nb * 32 - n, k)])
    return w.view(nb, 32, k // 2, 2).permute(0, 2, 1, 3).contiguous()


BF16_IMPLS = {"auto": 0, "avx512": 1, "avx2": 2}


class Bf16Linear(nn.Module):
    """A bf16 linear on specdec._C's kernel (AVX-512 BF16, or AVX2 + FMA): every row alone, in a fixed order (batch
    invariant)."""
    impl = "auto"   # class-wide: "avx2" forces the AVX2 path on a CPU that has both (tests run both)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = in_huge_pages(pack_bf16(weight))   # streamed every token: 2 MB pages (see hugepages.py)
        # fp32 once here (exact from bf16), as the kernel adds it, rather than converted on every call
        self.bias = None if bias is None else bias.detach().float()
        self.nbytes = self.packed.nbytes + (0 if bias is None else self.bias.nbytes)
        self._ext = _bf16_ext()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] bf16
        out = self._ext.linear_bf16(x.reshape(-1, self.in_features), self.packed, self.bias, self.out_features,
                                    BF16_IMPLS[self.impl])
        return out.view(*x.shape[:-1], self.out_features)


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """The fastest batch-invariant CPU linear for this weight: our bf16 kernel, else oneDNN packed."""
    if bf16_kernel_available(weight):
        return Bf16Linear(weight, bias)
    return PackedLinear(weight, bias)
