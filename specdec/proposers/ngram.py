"""Prompt lookup: propose what followed the latest earlier occurrence of the sequence's tail n-gram."""
from __future__ import annotations

import numpy as np
import torch

from .base import Draft, ProposalContext, Proposer
from .method import Method


def find_ngram_continuation(token_ids: list[int] | np.ndarray, k: int, max_n: int, min_n: int) -> list[int]:
    """Longest n (max_n down to min_n) whose tail n-gram occurred earlier; return up to k tokens after it.

    Among earlier occurrences the most recent wins (edits and repeated code tend to copy recent text).
    >>> find_ngram_continuation([1, 2, 3, 9, 1, 2], k=2, max_n=3, min_n=1)
    [3, 9]
    """
    return find_ngram_match(token_ids, k, max_n, min_n)[1]


def find_ngram_match(token_ids: list[int] | np.ndarray, k: int, max_n: int, min_n: int) -> tuple[int, list[int]]:
    """`find_ngram_continuation` plus the length n of the matched tail (0: no match); a longer match is a
    more reliable guess."""
    ids = np.asarray(token_ids, dtype=np.int64)
    length = len(ids)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = ids[length - n:]
        # candidate starts s with s + n < length (the continuation must have at least one token)
        windows = np.lib.stride_tricks.sliding_window_view(ids[: length - 1], n)
        hits = np.flatnonzero((windows == tail).all(axis=1))
        hits = hits[hits + n < length]
        hits = hits[hits != length - n]
        if hits.size:
            start = int(hits[-1]) + n
            return n, ids[start: start + k].tolist()
    return 0, []


def lookup_guess(token_ids: list[int], k: int, max_n: int, min_n: int, constraint=None) -> tuple[int, list[int]]:
    """A request's prompt-lookup guess: (matched n-gram length, up to k tokens), cut at the first token its grammar
    (a sampling.grammar.Constraint) forbids; (0, []) for k = 0."""
    n, guess = find_ngram_match(token_ids, k, max_n, min_n) if k > 0 else (0, [])
    if constraint is not None:
        guess = guess[:constraint.valid_prefix(guess)]
    return n, guess


class NgramProposer(Proposer):
    """Prompt lookup with each request's own n-gram sizes (ProposalContext.prompt_lookup_max/min); a constrained
    request's guess is cut at the first token its grammar forbids."""
    name = "ngram"
    free = True

    def match(self, ctx: ProposalContext, room: int) -> tuple[int, list[int]]:
        return lookup_guess(ctx.token_ids, room, ctx.prompt_lookup_max, ctx.prompt_lookup_min, ctx.constraint)

    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        return [Draft(torch.tensor(self.match(c, k)[1], dtype=torch.long)) for c, k in zip(ctxs, ks)]


# k 8: nearly free to propose, it keeps gaining up to k=8 on edit-style prompts (docs/tuning.md)
METHOD = Method("ngram", 8, "lookup", prior_alpha=0.3, step_lookup=True, build=lambda ctx: NgramProposer(),
                summary="prompt lookup: what followed the latest earlier occurrence of the tail n-gram "
                        "(prompt_lookup_max/min)")
