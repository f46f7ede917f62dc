"""Weights the CPU kernels stream on every token, moved into transparent huge pages (2 MB) where Linux allows.

A decode step reads ~1 GB of int4 weights (3 GB in bf16): in 4 KB pages that is ~250k TLB entries a token, and
the page walks cost the streaming kernels bandwidth. Anonymous memory advised with MADV_HUGEPAGE is backed by
2 MB pages (with `transparent_hugepage` set to `madvise` or `always`), 512x fewer. Measured with
`python -m specdec.bench.kernels` on the 2-core VM: the 1.5B's int4 stack 8-12% faster at one row and 10-20% at
four. Where the platform has no madvise or refuses it, the tensor stays where it is: this is only about speed.
"""
from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 << 20
MIN_BYTES = HUGE_PAGE          # smaller tensors would waste most of a 2 MB page


def in_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A copy of the CPU tensor `t` in memory advised for 2 MB pages (2 MB aligned), or `t` itself when that is
    not possible or not worth it. The copy keeps its buffer alive."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or t.device.type != "cpu" or t.nbytes < MIN_BYTES or not t.is_contiguous():
        return t
    size = -(-t.nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE   # room to start on a 2 MB boundary
    try:
        buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(advice)
    except (OSError, ValueError):
        return t
    raw = torch.frombuffer(buf, dtype=torch.uint8)             # holds `buf` for as long as a view of it lives
    offset = -raw.data_ptr() % HUGE_PAGE
    out = raw[offset: offset + t.nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out
