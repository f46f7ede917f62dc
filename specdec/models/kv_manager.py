"""The KV manager: owns one model's caches for every sequence, within a budget of cached positions.

A sequence's cache grows as the sequence does (doubling, so a long generation reallocates O(log n) times) and is
truncated in O(1) after a rejected draft. The budget (`max_total_tokens`, SGLang's name) counts allocated
positions, so admission can ask "does this fit?" before a step instead of failing inside one.
"""
from __future__ import annotations

from .kv_cache import SeqKV


class KVCapacityError(RuntimeError):
    """A cache could not grow within the budget (the scheduler preempts before this can happen)."""


class KVManager:
    def __init__(self, model, max_total_tokens: int):
        self.model = model
        self.block = max(1, model.key_block)          # capacities are multiples of the key block
        self.max_total_tokens = max_total_tokens
        self.caches: dict[int, SeqKV] = {}
        self.allocated = 0                             # positions allocated over all caches

    def get(self, seq_id: int) -> SeqKV:
        kv = self.caches.get(seq_id)
        if kv is None:
            kv = self.caches[seq_id] = self.model.new_kv()
        return kv

    def _round(self, n: int) -> int:
        return -(-n // self.block) * self.block

    def extra_needed(self, seq_id: int, positions: int) -> int:
        """Positions that would have to be allocated for `seq_id` to hold `positions` (0 if it already can)."""
        kv = self.caches.get(seq_id)
        have = kv.capacity if kv is not None else 0
        return max(0, self._round(positions) - have)

    @property
    def free(self) -> int:
        return self.max_total_tokens - self.allocated

    def ensure(self, seq_id: int, positions: int) -> SeqKV:
        """Grow `seq_id`'s cache to hold at least `positions` (rounded up to the key block)."""
        kv = self.get(seq_id)
        need = self._round(positions)
        if need <= kv.capacity:
            return kv
        # double when the budget allows it (fewer reallocations), else take exactly what is needed
        cap = max(need, min(self._round(2 * kv.capacity), kv.capacity + self.free))
        if cap - kv.capacity > self.free:
            raise KVCapacityError(f"KV cache budget exhausted: need {need - kv.capacity} more positions, "
                                  f"{self.free} of {self.max_total_tokens} free")
        self.allocated += cap - kv.capacity
        kv.resize(cap)
        return kv

    def commit(self, seq_id: int, length: int) -> None:
        """The first `length` positions hold committed tokens (after a forward wrote them). Moving it back forgets
        a rejected draft: O(1), nothing copied; the stale positions are overwritten by the next forward."""
        kv = self.get(seq_id)
        if not 0 <= length <= kv.capacity:
            raise ValueError(f"cannot commit {length} positions: the cache holds {kv.capacity}")
        kv.length = length

    def compact(self, seq_id: int, start: int, rows: list[int]) -> None:
        """A token tree was verified at positions start..: move the K/V of the rows kept (ascending offsets from
        start) to start, start+1, ... (a no-op for a chain's rows 0..n-1)."""
        if rows != list(range(len(rows))):
            self.get(seq_id).move([start + r for r in rows], start)

    def truncate(self, seq_id: int, length: int) -> None:
        """Forget every position >= length (O(1): moves the length, copies nothing)."""
        kv = self.caches.get(seq_id)
        if kv is not None:
            if not 0 <= length <= kv.length:
                raise ValueError(f"cannot truncate to {length}: the cache holds {kv.length} positions")
            kv.length = length

    def free_seq(self, seq_id: int) -> None:
        kv = self.caches.pop(seq_id, None)
        if kv is not None:
            self.allocated -= kv.capacity

    @property
    def num_seqs(self) -> int:
        return len(self.caches)

    @property
    def nbytes(self) -> int:
        return sum(kv.nbytes for kv in self.caches.values())
