"""Suffix decoding (Oliaro et al., arXiv 2411.04975; vLLM's and SGLang's method "suffix"): speculation from
everything a pool has already generated, and from the request itself.

Each speculation pool (`spec_pool`) keeps its past outputs as one token array, requests separated by a marker,
bounded to `max_tokens` (the oldest requests leave first). To propose, the request's tail is matched against the
pool's outputs and against the request's own tokens (prompt lookup's source): the longest suffix that occurs
(up to `max_match` tokens) gives a set of occurrences, and what followed them is counted into a tree of
continuations. The tree is cut where a path's share of the occurrences falls below `min_token_prob`, and its
length grows with the match (`max_spec_factor` x the matched length, at most k): a long match that always went
on the same way drafts long, a short or ambiguous one drafts little or nothing. A greedy request without a grammar
verifies the likeliest nodes as a token tree (exactly, by argmax); the others verify the likeliest path as a
chain (a one-hot q_draft: exact rejection sampling).

The search is a vectorized scan for the tail's last token, then filters on the tokens before it: no index to keep
in memory beyond the token array (4 bytes a token), and a few hundred microseconds per sequence and step.
"""
from __future__ import annotations

import collections
import json
import threading
from dataclasses import dataclass

import numpy as np
import torch

from ..utils import atomic_path
from .base import Draft, ProposalContext, Proposer, tree_allowed
from .method import Method

SEP = -1                      # between requests in a pool's token array: no match or continuation crosses it


@dataclass
class SuffixConfig:
    max_tokens: int = 262_144         # per pool (1 MiB of int32); oldest requests dropped first
    max_pools: int = 64               # pools kept (least recently used dropped)
    max_match: int = 24               # longest tail matched
    min_match: int = 2                # shorter matches propose nothing (one token is too ambiguous)
    max_occurrences: int = 256        # most recent occurrences whose continuations are counted
    min_token_prob: float = 0.1       # a node whose path holds less of the occurrences is not drafted
    max_spec_factor: float = 2.0      # at most this x the matched length, and k, tokens deep


class PoolCorpus:
    """One pool's past outputs, most recent last."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.requests: collections.deque[np.ndarray] = collections.deque()
        self.size = 0
        self._array: np.ndarray | None = None         # the concatenation, rebuilt lazily after a change

    def add(self, tokens: list[int]) -> None:
        if not tokens:
            return
        arr = np.asarray(tokens[-self.max_tokens:], dtype=np.int32)
        self.requests.append(arr)
        self.size += len(arr) + 1
        while self.size > self.max_tokens and len(self.requests) > 1:
            self.size -= len(self.requests.popleft()) + 1
        self._array = None

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            parts = [x for r in self.requests for x in (r, np.array([SEP], dtype=np.int32))]
            self._array = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
        return self._array


def match_ends(corpus: np.ndarray, tail: np.ndarray, max_match: int, min_match: int,
               exclude_end: int | None = None) -> tuple[int, np.ndarray]:
    """The longest n (<= max_match) such that tail[-n:] occurs in corpus with at least one token after it; returns
    (n, positions of the token after each occurrence). exclude_end: an occurrence ending there is the tail itself."""
    if len(tail) == 0 or len(corpus) < 2:
        return 0, np.empty(0, dtype=np.int64)
    cand = np.flatnonzero(corpus[:-1] == tail[-1]) + 1          # positions right after a match of length 1
    if exclude_end is not None:
        cand = cand[cand != exclude_end]
    cand = cand[corpus[cand] != SEP]
    best_n, best = (1, cand) if cand.size else (0, cand)
    n = 1
    while cand.size and n < min(max_match, len(tail)):
        prev = cand - n - 1                                        # the token before the current match
        ok = prev >= 0
        cand, prev = cand[ok], prev[ok]
        cand = cand[corpus[prev] == tail[-n - 1]]
        n += 1
        if cand.size:
            best_n, best = n, cand
    if best_n < min_match:
        return 0, np.empty(0, dtype=np.int64)
    return best_n, best


def continuation_tree(corpus_hits: list[tuple[np.ndarray, np.ndarray]], depth: int, budget: int,
                      min_prob: float) -> tuple[list[int], list[int], list[float]]:
    """Count what followed each occurrence into a tree, up to `depth` tokens; return the `budget` likeliest nodes
    with path probability >= min_prob, parents before children: (tokens, parents (-1: the root), probabilities)."""
    total = sum(len(starts) for _, starts in corpus_hits)
    if total == 0 or depth <= 0 or budget <= 0:
        return [], [], []
    children: dict[tuple[int, int], int] = {}       # (parent node, token) -> node
    counts: list[int] = []
    tokens: list[int] = []
    parents: list[int] = []
    for corpus, starts in corpus_hits:
        for s in starts.tolist():
            node = -1
            for t in corpus[s: s + depth].tolist():
                if t == SEP:
                    break
                key = (node, t)
                child = children.get(key)
                if child is None:
                    child = children[key] = len(tokens)
                    tokens.append(t)
                    parents.append(node)
                    counts.append(0)
                counts[child] += 1
                node = child
    probs = [c / total for c in counts]
    ranked = sorted((i for i in range(len(tokens)) if probs[i] >= min_prob), key=lambda i: -probs[i])[:budget]
    # a node's probability never exceeds its parent's, so the kept set is closed under parents; renumber in order
    kept = sorted(ranked)
    index = {old: new for new, old in enumerate(kept)}
    return ([tokens[i] for i in kept], [index[parents[i]] if parents[i] >= 0 else -1 for i in kept],
            [probs[i] for i in kept])


def best_path(tokens: list[int], parents: list[int], probs: list[float]) -> list[int]:
    """The chain through the tree that follows the likeliest child at each step."""
    path, node = [], -1
    while True:
        kids = [i for i, p in enumerate(parents) if p == node]
        if not kids:
            return path
        node = max(kids, key=lambda i: probs[i])
        path.append(tokens[node])


class SuffixProposer(Proposer):
    name = "suffix"
    free = True                       # no forward: asked while the step is planned

    def __init__(self, cfg: SuffixConfig | None = None, vocab_size: int | None = None):
        self.cfg = cfg or SuffixConfig()
        self.vocab_size = vocab_size              # a loaded file's tokens must be ids of this vocabulary
        self.pools: collections.OrderedDict[str, PoolCorpus] = collections.OrderedDict()
        self.seq_pools: dict[int, str] = {}
        self._lock = threading.Lock()             # learn/save may come from another thread than propose

    # -- what the pool learns -----------------------------------------------------------------------------------
    def pool(self, name: str) -> PoolCorpus:
        corpus = self.pools.get(name)
        if corpus is None:
            corpus = self.pools[name] = PoolCorpus(self.cfg.max_tokens)
            while len(self.pools) > self.cfg.max_pools:
                self.pools.popitem(last=False)
        self.pools.move_to_end(name)
        return corpus

    def learn(self, corpus: str, prompt_ids: list[int], output_ids: list[int]) -> None:
        """A finished request's output joins its corpus (the prompt is searched per request, as it comes)."""
        with self._lock:
            self.pool(corpus).add(list(output_ids))

    # -- proposing ------------------------------------------------------------------------------------------------
    def match(self, ctx: ProposalContext, room: int) -> tuple[int, list[int]]:
        tokens, _, n = self.guess(ctx, room, chain=True)
        return n, tokens

    def guess(self, ctx: ProposalContext, k: int, chain: bool = False) -> tuple[list[int], list[int] | None, int]:
        """(tokens, parents or None for a chain, matched length) for one sequence; a tree only for a greedy request
        without a grammar, unless `chain`."""
        cfg = self.cfg
        ids = np.asarray(ctx.token_ids, dtype=np.int32)
        tail = ids[-cfg.max_match:]
        hits = []
        n_own, own = match_ends(ids, tail, cfg.max_match, cfg.min_match, exclude_end=len(ids))
        with self._lock:
            corpus = self.pools.get(ctx.corpus)
            arr = corpus.array if corpus is not None else None
        n_pool, found = match_ends(arr, tail, cfg.max_match, cfg.min_match) if arr is not None else (0, None)
        n = max(n_own, n_pool)
        if n == 0:
            return [], None, 0
        # the longest match wins; equal lengths count both sources' continuations
        if n_own == n:
            hits.append((ids, own[-cfg.max_occurrences:]))
        if n_pool == n:
            hits.append((arr, found[-cfg.max_occurrences:]))
        depth = min(k, max(1, int(cfg.max_spec_factor * n)))
        tree = not chain and tree_allowed(2, ctx.params, ctx.constraint)
        tokens, parents, probs = continuation_tree(hits, depth, k if tree else depth * 4, cfg.min_token_prob)
        if not tree:
            tokens, parents = best_path(tokens, parents, probs)[:k], None
            if ctx.constraint is not None:
                tokens = tokens[:ctx.constraint.valid_prefix(tokens)]
        return tokens, parents, n

    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        out = []
        for ctx, k in zip(ctxs, ks):
            tokens, parents, _ = self.guess(ctx, k) if k > 0 else ([], None, 0)
            out.append(Draft(torch.tensor(tokens, dtype=torch.long), None, parents if tokens else None))
        return out

    # -- memory and persistence -------------------------------------------------------------------------------------
    @property
    def cache_bytes(self) -> int:
        return sum(4 * c.size for c in self.pools.values())

    def status(self) -> dict:
        with self._lock:
            return {"pools": len(self.pools), "tokens": sum(c.size for c in self.pools.values()),
                    "bytes": self.cache_bytes, "max_tokens_per_pool": self.cfg.max_tokens}

    def save(self, path: str) -> None:
        """Every pool's outputs, as JSON, written atomically (a restarted server keeps what it learned)."""
        with self._lock:
            data = {"version": 1, "pools": {name: [r.tolist() for r in c.requests] for name, c in self.pools.items()}}
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(data, separators=(",", ":")))

    def load(self, path: str) -> None:
        """Read what `save` wrote: all of it, or nothing (SpecDecError, the pools untouched), so that a damaged file
        (or one from another model's vocabulary) never drafts tokens that are not ids of this one."""
        from ..errors import SpecDecError

        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or not isinstance(data.get("pools"), dict):
                raise ValueError("not a suffix cache (no 'pools' object)")
            pools = {}
            for name, requests in data["pools"].items():
                arrays = [np.asarray(r, dtype=np.int64) for r in requests]
                for a in arrays:
                    if a.ndim != 1 or (a.size and (a.min() < 0 or (self.vocab_size and a.max() >= self.vocab_size))):
                        raise ValueError(f"pool '{name}' holds token ids outside the vocabulary")
                pools[str(name)] = arrays
        except (OSError, ValueError, TypeError, AttributeError, OverflowError) as exc:
            raise SpecDecError(f"--suffix-cache {path}: cannot read it ({type(exc).__name__}: {exc})") from None
        with self._lock:
            for name, arrays in pools.items():
                corpus = self.pool(name)
                for a in arrays:
                    corpus.add(a.tolist())


METHOD = Method("suffix", 8, "cache", prior_alpha=0.3, build=lambda ctx: SuffixProposer(vocab_size=ctx.vocab_size),
                state_file="suffix_cache",
                summary="suffix decoding: the longest suffix match over the pool's past outputs and the request "
                        "itself (a token tree for greedy requests; --suffix-cache keeps the pools)")
