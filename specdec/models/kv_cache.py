"""One sequence's K/V for every layer. The model writes at the positions it is given; nothing here moves a length.

`length` (the positions holding committed tokens) is owned by the engine's KV manager: truncating a rejected draft
is `length = n`, O(1), nothing copied; the stale entries past it are overwritten by the next forward and never
attended to (the attention mask stops at the tokens of the step). Capacity grows on demand (`resize`), so a
request costs memory for the tokens it has, not for the whole context window.
"""
from __future__ import annotations

import torch


class SeqKV:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str | None = None):
        self.shape = (num_layers, num_kv_heads, 0, head_dim)
        self.k = torch.zeros(self.shape, dtype=dtype, device=device)   # [L, Hkv, capacity, D]
        self.v = torch.zeros(self.shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def resize(self, capacity: int) -> None:
        """Reallocate to `capacity` positions, keeping the committed ones. New positions are zero: padded keys past
        the step are masked, and a masked key must not hold a NaN (0 x NaN is NaN in the weighted sum)."""
        L, H, _, D = self.shape
        keep = min(self.length, capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.zeros((L, H, capacity, D), dtype=old.dtype, device=old.device)
            new[:, :, :keep] = old[:, :, :keep]
            setattr(self, name, new)
        self.length = keep

    def move(self, src: list[int], dst: int) -> None:
        """Copy the entries at positions src (ascending) to dst, dst+1, ... in every layer (a tree's kept path)."""
        idx = torch.tensor(src, device=self.k.device)
        for t in (self.k, self.v):
            t[:, :, dst: dst + len(src)] = t[:, :, idx]

    def copy_from(self, other: SeqKV, n: int) -> None:
        """Positions 0..n-1 of every layer from another cache of the same model (a prefix cache hit)."""
        self.k[:, :, :n] = other.k[:, :, :n]
        self.v[:, :, :n] = other.v[:, :, :n]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of layer i  # [Hkv, capacity, D] views."""
        return self.k[i], self.v[i]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
