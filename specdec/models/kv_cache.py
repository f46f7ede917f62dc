"""One sequence's K/V for every layer (SeqKV; WindowedKV: a sliding-window model's, whose local layers keep a span of
recent positions). The model writes at the positions it is given; nothing here moves a length.

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

    def resize(self, capacity: int, need: int | None = None) -> None:
        """Reallocate to `capacity` positions, keeping the committed ones (`need`: where the next forward writes up
        to, for a WindowedKV's span). New positions are zero: padded keys past
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

    # -- what the KV manager asks of any cache (WindowedKV answers for a sliding-window model) -------------------
    @property
    def footprint(self) -> int:
        """Its memory in positions of a whole-model cache (what the budget counts)."""
        return self.capacity

    def footprint_after(self, capacity: int, need: int) -> int:
        """The footprint once resized to `capacity` for a forward writing below position `need`."""
        return capacity

    def holds(self, need: int) -> bool:
        """Whether a forward writing below position `need` fits as the cache stands."""
        return need <= self.capacity

    def serves(self, n: int) -> bool:
        """Whether a sequence may start after its first n positions copied from here (a prefix hit)."""
        return True

    def tensors(self) -> list[tuple[torch.Tensor, int]]:
        """Every K/V tensor [layers, Hkv, slots, D] with the position its slot 0 holds."""
        return [(self.k, 0), (self.v, 0)]

    def peak_footprint(self, positions: int, step_rows: int) -> int:
        """The most a sequence growing to `positions`, at most `step_rows` rows a forward, takes of the budget."""
        return positions

    def start_at(self, position: int) -> None:
        """An empty cache whose sequence will start at `position` (after a prefix hit): nothing to do here."""


class WindowedKV(SeqKV):
    """A sliding-window model's cache (Gemma 3): the global layers keep every position, as SeqKV does (`k`, `v`);
    the local layers, which attend over the last W positions only, keep a span of recent ones: positions base ..
    base + local capacity - 1 at slots 0.. of `local` (a SeqKV of those layers).

    The span slides forward when a forward needs room past it, keeping the last W committed positions (all that a
    row at a position >= length attends), and is sized W beyond what that forward needs, so it slides about once
    every W positions. So past the window a position costs the global layers' share of a whole-model position, and
    the budget (`footprint`) counts that. The local layers attend in the span's coordinates (position - base):
    every row keeps exactly its keys (models/runner.forward_spans builds the metadata)."""

    SLACK = 64

    def __init__(self, sliding: list[bool], window: int, block: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None = None):
        n_local = sum(sliding)
        super().__init__(len(sliding) - n_local, num_kv_heads, head_dim, dtype, device)
        self.local = SeqKV(n_local, num_kv_heads, head_dim, dtype, device)
        self.window, self.block, self.base = window, block, 0
        # layers in all; a layer's index among those of its kind is Gemma3Attention.cache_index
        self.num_layers = len(sliding)

    def _round(self, n: int) -> int:
        return -(-n // self.block) * self.block

    def _plan(self, capacity: int, need: int) -> tuple[int, int]:
        """(base, local capacity) for a forward writing below position `need`, with `capacity` global positions."""
        lcap = self.local.capacity
        if need - self.base <= lcap:
            return self.base, lcap
        # the last W committed positions, and SLACK more: a next turn's prompt may end a few tokens before the
        # answer did (a chat template's closing tokens), and a prefix hit must still find its window
        base = max(self.base, min(self.length, need) - self.window - self.SLACK)
        return base, max(lcap, min(self._round(need - base + self.window), self._round(capacity - base)))

    def _worth(self, capacity: int, lcap: int) -> int:
        """Whole-model positions worth `capacity` global and `lcap` local positions of memory (rounded up)."""
        return -(-(self.k.shape[0] * capacity + self.local.k.shape[0] * lcap) // self.num_layers)

    @property
    def footprint(self) -> int:
        return self._worth(self.capacity, self.local.capacity)

    def footprint_after(self, capacity: int, need: int) -> int:
        return self._worth(capacity, self._plan(capacity, need)[1])

    def holds(self, need: int) -> bool:
        return need <= self.capacity and need - self.base <= self.local.capacity

    def serves(self, n: int) -> bool:
        return self.base <= max(0, n - self.window) and n - self.base <= self.local.capacity

    def tensors(self) -> list[tuple[torch.Tensor, int]]:
        return [(self.k, 0), (self.v, 0), (self.local.k, self.base), (self.local.v, self.base)]

    def start_at(self, position: int) -> None:
        # sized from there on: the span of a sequence resuming after a long prefix holds only its window
        if self.length == 0:
            self.base = max(0, position - self.window)

    def peak_footprint(self, positions: int, step_rows: int) -> int:
        # a slide leaves W + SLACK committed positions and room for a step and W more (_plan)
        return self._worth(positions, min(positions, self._round(step_rows + 2 * self.window + self.SLACK)))

    def _respan(self, base: int, lcap: int, keep_to: int) -> None:
        """Move the local span to start at `base` with `lcap` slots, keeping positions base .. keep_to - 1."""
        keep = max(0, keep_to - base)
        off = base - self.base
        for name in ("k", "v"):
            old = getattr(self.local, name)
            if lcap == old.shape[2]:
                if off:
                    old[:, :, :keep] = old[:, :, off: off + keep].clone()
                continue
            new = torch.zeros((*old.shape[:2], lcap, old.shape[3]), dtype=old.dtype, device=old.device)
            new[:, :, :keep] = old[:, :, off: off + keep]
            setattr(self.local, name, new)
        self.base = base

    def resize(self, capacity: int, need: int | None = None) -> None:
        base, lcap = self._plan(capacity, capacity if need is None else need)
        if capacity != self.capacity:
            super().resize(capacity)
        if (base, lcap) != (self.base, self.local.capacity):
            self._respan(base, lcap, self.length)

    def move(self, src: list[int], dst: int) -> None:
        super().move(src, dst)
        self.local.move([s - self.base for s in src], dst - self.base)

    def copy_from(self, other: SeqKV, n: int) -> None:
        """Positions 0..n-1 from another cache of the model: every one on the global layers, the last W on the
        local ones (`other.serves(n)` must hold), keeping the local room this cache was sized for."""
        super().copy_from(other, n)
        lo = max(0, n - self.window)
        reserved = self.base + self.local.capacity     # what the last resize made room below: the span restarts
        lcap = max(self._round(n - lo), min(self._round(reserved - lo + self.window), self.local.capacity))   # at lo
        self._respan(lo, lcap, lo)
        src = other.local
        self.local.k[:, :, : n - lo] = src.k[:, :, lo - other.base: n - other.base]
        self.local.v[:, :, : n - lo] = src.v[:, :, lo - other.base: n - other.base]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError("a windowed cache's layers are reached through forward_spans' metadata")

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.local.nbytes
