"""Automatic prefix caching: the K/V of finished requests, kept and matched by token prefix.

Every chat client resends the whole conversation each turn, and agents resend the same system prompt and tools on
every call. When a request ends, its caches (the target's, and a draft model's) become an entry here, keyed by
the tokens whose K/V they hold; a new request's prefill starts after the longest prefix an entry shares with its
prompt, copying that prefix into its own cache.

Copied, not shared: a sequence's cache is one contiguous tensor per model (what the CPU attention kernels read),
so a hit copies the prefix (about 28 KB a token for the 1.5B target: ~1 ms per thousand tokens, against seconds to
prefill them). Entries are never written by a running sequence, so preemption and abort cannot corrupt them.

Exact: a hit must give the same tokens as a fresh prefill. An entry counts how many of its leading positions hold
K/V that a fresh prefill would compute bit for bit (`exact`), and only those are reused for the target. Where rows
are exact (bf16 and int4 on CPU: every row, prompt or generated, takes the batch-invariant row-by-row attention;
models/runner.exact_rows) that is every position a finished request computed: a conversation's next turn reuses
the whole answer at once. Elsewhere (fp32, CUDA) prompt rows take flash attention, whose K/V differs in the last
bits from the decode steps', so only the prompt's positions are exact at first and the generated tokens' K/V is
recomputed as prompt rows while the engine has nothing else to do (`settle`). The draft's K/V needs no exactness
(its tokens are verified) and is reused as far as it matches.

Tenants: an entry belongs to the cache_salt of the request that made it (vLLM's per-request field; the server adds
the API key's tenant), and only a request with the same salt reuses it. Without that a client could learn what
another sent: a prompt someone else sent before starts faster, and `cached_tokens` says by how many tokens.

Memory: entries live in the target KV manager's budget (`max_total_tokens`); when a running sequence needs the
room, the least recently used entries are evicted first (vLLM's automatic prefix caching and SGLang's radix cache
evict the same way).
"""
from __future__ import annotations

import collections
import hashlib
import itertools
from dataclasses import dataclass, field

import numpy as np

from .kv_cache import SeqKV


@dataclass
class PrefixEntry:
    tokens: np.ndarray                  # [n] the tokens whose K/V `kv` holds at positions 0..n-1 (or will, settled)
    kv: SeqKV                           # the target's cache (length: positions computed)
    exact: int                          # leading positions computed as prompt rows (reusable bit for bit)
    extras: dict[str, SeqKV] = field(default_factory=dict)   # proposers' caches (a draft model's), by method
    pinned: int = 0                     # > 0 while a hit is being copied out: not evicted
    salt: str = ""                      # the partition it belongs to (salt_key of its request's cache_salt)
    entry_id: int = field(default_factory=lambda: next(_ids))

    @property
    def unsettled(self) -> int:
        """Positions still to be computed as prompt rows (generated tokens, or the last one without K/V)."""
        return min(len(self.tokens), self.kv.capacity) - self.exact


_ids = itertools.count()


def salt_key(cache_salt: str | None) -> str:
    """A request's partition: "" (shared) without a salt, else a digest of it (what is kept and shown: never the
    salt itself, which is a secret of its tenant)."""
    return "" if cache_salt is None else hashlib.sha256(cache_salt.encode()).hexdigest()[:32]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


@dataclass
class Hit:
    entry: PrefixEntry | None           # the entry reused, or None: a running sequence's prompt is (source_seq)
    target: int                         # positions of the target's K/V to reuse (exact ones)
    matched: int                        # tokens the source shares with the prompt (the draft may reuse these)
    source_seq: int | None = None       # a running sequence's id, whose computed prompt K/V is copied


class PrefixCache:
    def __init__(self):
        self.entries: collections.OrderedDict[int, PrefixEntry] = collections.OrderedDict()   # LRU first
        self.queries = 0                # prompt tokens looked up (vLLM's prefix_cache_queries, in tokens)
        self.hits = 0                   # of them, tokens whose K/V came from the cache (prefix_cache_hits)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def capacity(self) -> int:
        """Target positions the entries hold (what they take of the KV budget, `SeqKV.footprint`)."""
        return sum(e.kv.footprint for e in self.entries.values())

    @property
    def evictable(self) -> int:
        return sum(e.kv.footprint for e in self.entries.values() if not e.pinned)

    @property
    def tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries.values())

    @property
    def nbytes(self) -> int:
        return sum(e.kv.nbytes + sum(x.nbytes for x in e.extras.values()) for e in self.entries.values())

    def lookup(self, token_ids: list[int], limit: int, salt: str = "") -> Hit | None:
        """The entry of partition `salt` sharing the longest reusable prefix with token_ids, reusing at most
        `limit` positions. The caller pins the hit's entry while it copies, and counts queries and hits once the
        sequence is admitted."""
        if not self.entries or limit <= 0:
            return None
        ids = np.asarray(token_ids[:limit + 1], dtype=np.int64)
        best: Hit | None = None
        for e in self.entries.values():
            if e.salt != salt:
                continue
            m = common_prefix(e.tokens, ids)
            hit = Hit(e, min(m, e.exact, limit), min(m, limit))
            if best is None or (hit.target, hit.matched) > (best.target, best.matched):
                best = hit
        if best is None or best.target == 0:
            return None
        self.entries.move_to_end(best.entry.entry_id)                     # most recently used
        return best

    def insert(self, tokens: list[int], kv: SeqKV, exact: int, extras: dict[str, SeqKV],
               salt: str = "") -> list[PrefixEntry]:
        """Keep a finished sequence's caches; returns the entries to free: those it supersedes (their tokens a
        prefix of the new one's, nothing exact beyond it), or the new one itself when an entry already holds all
        of its tokens exactly (a conversation's earlier turn replayed)."""
        entry = PrefixEntry(np.asarray(tokens, dtype=np.int64), kv, min(exact, kv.length, len(tokens)), extras,
                            salt=salt)
        for e in self.entries.values():
            if (e.salt == salt and e.exact >= len(entry.tokens)
                    and common_prefix(e.tokens, entry.tokens) == len(entry.tokens)):
                self.entries.move_to_end(e.entry_id)
                return [entry]
        dropped = [e for e in self.entries.values()
                   if not e.pinned and e.salt == salt and len(e.tokens) <= len(entry.tokens)
                   and common_prefix(e.tokens, entry.tokens) == len(e.tokens) and e.exact <= entry.exact]
        for e in dropped:
            del self.entries[e.entry_id]
        self.entries[entry.entry_id] = entry
        return dropped

    def pop_lru(self) -> PrefixEntry | None:
        """Remove and return the least recently used unpinned entry (None: none left)."""
        for key, e in self.entries.items():
            if not e.pinned:
                del self.entries[key]
                return e
        return None

    def to_settle(self) -> PrefixEntry | None:
        """The most recently used entry with positions still to compute as prompt rows."""
        for e in reversed(self.entries.values()):
            if e.unsettled > 0 and not e.pinned:
                return e
        return None

    def clear(self) -> list[PrefixEntry]:
        out = list(self.entries.values())
        self.entries.clear()
        return out
