"""The KV manager: owns one model's caches for every sequence, within a budget of cached positions.

A sequence's cache grows as the sequence does (doubling, so a long generation reallocates O(log n) times) and is
truncated in O(1) after a rejected draft. The budget (`max_total_tokens`, SGLang's name) counts allocated
positions, so admission can ask "does this fit?" before a step instead of failing inside one; a sliding-window
model's cache counts as the whole-model positions its memory is worth (`SeqKV.footprint`: its local layers keep
a span of recent positions, kv_cache.WindowedKV).

With a prefix cache (models/prefix_cache.py), finished sequences' caches stay here as entries inside the same
budget: they count as free for admission, and the least recently used are evicted when a sequence needs the room.
"""
from __future__ import annotations

from .kv_cache import SeqKV
from .prefix_cache import Hit, PrefixCache


class KVCapacityError(RuntimeError):
    """A cache could not grow within the budget (the scheduler preempts before this can happen)."""


class KVManager:
    def __init__(self, model, max_total_tokens: int, prefix_cache: PrefixCache | None = None):
        self.model = model
        self.block = max(1, model.key_block)          # capacities are multiples of the key block
        self.max_total_tokens = max_total_tokens
        self.caches: dict[int, SeqKV] = {}
        self.prefix = prefix_cache
        self.allocated = 0                             # positions allocated over all caches and prefix entries

    def get(self, seq_id: int) -> SeqKV:
        kv = self.caches.get(seq_id)
        if kv is None:
            kv = self.caches[seq_id] = self.model.new_kv()
        return kv

    def _round(self, n: int) -> int:
        return -(-n // self.block) * self.block

    def extra_needed(self, seq_id: int, positions: int) -> int:
        """Positions that would have to be allocated for `seq_id` to hold `positions` (0 if it already can), in
        whole-model positions (a sliding-window model's local layers cost less: `SeqKV.footprint`)."""
        kv = self.caches.get(seq_id)
        need = self._round(positions)
        if kv is None:
            return self.model.new_kv().footprint_after(need, need)
        return 0 if kv.holds(need) else max(0, kv.footprint_after(max(need, kv.capacity), need) - kv.footprint)

    def start_at(self, seq_id: int, position: int) -> None:
        """A new sequence will compute from `position` on (after a prefix hit; 0 without): a windowed cache sizes
        its local span from there."""
        self.get(seq_id).start_at(position)

    def peak_needed(self, positions: int, step_rows: int) -> int:
        """The most of the budget one sequence growing to `positions` ever takes (`step_rows` a forward at most)."""
        return self.model.new_kv().peak_footprint(self._round(positions), step_rows)

    @property
    def free(self) -> int:
        """Positions a sequence may still take: unallocated ones, and those of prefix entries it may evict."""
        return self.max_total_tokens - self.allocated + (self.prefix.evictable if self.prefix is not None else 0)

    def _make_room(self, positions: int) -> bool:
        """Evict least recently used prefix entries until `positions` are unallocated; False if they cannot be."""
        while self.max_total_tokens - self.allocated < positions:
            entry = self.prefix.pop_lru() if self.prefix is not None else None
            if entry is None:
                return False
            self.allocated -= entry.kv.footprint
        return True

    def ensure(self, seq_id: int, positions: int) -> SeqKV:
        """Grow `seq_id`'s cache to hold at least `positions` (rounded up to the key block)."""
        kv = self.get(seq_id)
        need = self._round(positions)
        if kv.holds(need):
            return kv
        # double when unallocated room allows it (fewer reallocations; never evicts for it), else take exactly
        # what is needed
        cap = kv.capacity
        if need > cap:
            cap = max(need, min(self._round(2 * cap), cap + self.max_total_tokens - self.allocated))
        grow = kv.footprint_after(cap, need) - kv.footprint
        if not self._make_room(grow):
            raise KVCapacityError(f"KV cache budget exhausted: need {grow} more positions, "
                                  f"{self.free} of {self.max_total_tokens} free")
        self.allocated += grow
        kv.resize(cap, need)
        return kv

    # -- prefix caching ------------------------------------------------------------------------------------------
    def lookup(self, token_ids: list[int], limit: int, salt: str = "") -> Hit | None:
        """The prefix entry (of partition `salt`) to start `token_ids` from (reusing at most `limit` positions),
        pinned until `adopt` or `unpin`; None without a prefix cache or a match."""
        hit = self.prefix.lookup(token_ids, limit, salt) if self.prefix is not None else None
        if hit is not None and not self.usable(hit):                  # a window the entry no longer holds
            hit = None
        if hit is not None:
            hit.entry.pinned += 1
        return hit

    def usable(self, hit: Hit) -> bool:
        """Whether the hit's source still holds what a sequence starting after hit.target needs (a sliding-window
        model's local layers keep only their recent positions)."""
        source = hit.entry.kv if hit.entry is not None else self.caches.get(hit.source_seq)
        return source is not None and source.serves(hit.target)

    def adopt(self, seq_id: int, hit: Hit) -> None:
        """Copy the hit's exact prefix (an entry's, or a running sequence's) into `seq_id`'s cache (ensured large
        enough by the caller)."""
        kv = self.get(seq_id)
        before = kv.footprint
        kv.copy_from(hit.entry.kv if hit.entry is not None else self.caches[hit.source_seq], hit.target)
        kv.length = hit.target
        self.allocated += kv.footprint - before             # a windowed cache's span may shrink to the window

    @staticmethod
    def unpin(hit: Hit) -> None:
        if hit.entry is not None:
            hit.entry.pinned -= 1

    def keep(self, seq_id: int, tokens: list[int], exact: int, extras: dict[str, SeqKV], salt: str = "") -> None:
        """A finished sequence's cache becomes a prefix entry for `tokens` (its first `exact` positions computed
        as prompt rows; the rest are settled later). Without a prefix cache: freed."""
        kv = self.caches.pop(seq_id, None)
        if kv is None:
            return
        if self.prefix is None or exact <= 0:
            self.allocated -= kv.footprint
            return
        # the entry takes room for every token (settling computes the ones without K/V), when the budget has it
        cap = self._round(len(tokens))
        grow = kv.footprint_after(cap, cap) - kv.footprint
        if cap > kv.capacity and not self._make_room(grow):
            cap = kv.capacity
        if cap != kv.capacity:
            before = kv.footprint
            kv.resize(cap)
            self.allocated += kv.footprint - before
        for old in self.prefix.insert(tokens[:cap], kv, exact, extras, salt):     # superseded, or the new one itself
            self.allocated -= old.kv.footprint

    def clear_prefix_cache(self) -> None:
        for entry in self.prefix.clear() if self.prefix is not None else ():
            self.allocated -= entry.kv.footprint

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
            self.allocated -= kv.footprint

    @property
    def num_seqs(self) -> int:
        return len(self.caches)

    @property
    def nbytes(self) -> int:
        """Bytes of the running sequences' caches (prefix entries: `prefix.nbytes`)."""
        return sum(kv.nbytes for kv in self.caches.values())

    def pop(self, seq_id: int) -> SeqKV | None:
        """Take a sequence's cache out of this manager (a proposer hands it to a prefix entry), freeing its budget."""
        kv = self.caches.pop(seq_id, None)
        if kv is not None:
            self.allocated -= kv.footprint
        return kv

    def adopt_extra(self, seq_id: int, source: SeqKV, positions: int) -> int:
        """Copy the first `positions` of `source` (limited to what it holds and to free room) into `seq_id`'s cache;
        returns the positions copied."""
        n = min(positions, source.length)
        if n <= 0 or not source.serves(n):
            return 0
        self.start_at(seq_id, n)
        if self.extra_needed(seq_id, n) > self.free:
            return 0
        kv = self.ensure(seq_id, n)
        before = kv.footprint
        kv.copy_from(source, n)
        kv.length = n
        self.allocated += kv.footprint - before
        return n
