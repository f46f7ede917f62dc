"""A preallocated per-sequence KV cache whose rollback is O(1)."""
from __future__ import annotations

import torch


class KVCache:
    """K and V for every layer, preallocated to `max_len` tokens.

    `length` is the number of committed positions. A forward writes new K/V at [length, length+T) and
    advances `length`; `rollback(n)` only moves `length` back (the stale entries past it are simply
    overwritten by the next forward and never attended to). Nothing is ever copied.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str | None = None):
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, max_len, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v  # [B, Hkv, T, D] at positions start..start+T."""
        end = start + k.shape[2]
        if end > self.max_len:
            raise IndexError(f"KV cache overflow: {end} positions > capacity {self.max_len}")
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v

    def view(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of positions 0..length  # [B, Hkv, length, D], views (no copy)."""
        return self.k[layer, :, :, :length], self.v[layer, :, :, :length]

    def rollback(self, to_length: int) -> None:
        """Forget every position >= to_length. O(1): moves the length, copies nothing."""
        if not 0 <= to_length <= self.length:
            raise ValueError(f"cannot roll back to {to_length}: cache holds {self.length} positions")
        self.length = to_length

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
