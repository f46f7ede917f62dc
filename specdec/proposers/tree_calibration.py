"""How often a head's tree guesses are really accepted, learned from verification (one per head proposer).

A token tree is sized by the head's own probabilities (proposers/tree.py): a node's path probability is taken as
the chance verification reaches it. A head trained on little data is not calibrated, and how far off it is depends
on the text (`python -m specdec.train.evaluate --calibrate`, int4 target, trees of 4 guesses a node, 4 levels): the
shipped EAGLE-3 head gives its best guesses 0.69 on average over the benchmark's code-gen prompts, and 0.615 of them
are the target's token (p^1.50 fits), while on held-out asks like its training text (`--data
functions:pydash[200:280]`) it says 0.747 and is right 0.749 of the time (p^1.00); its other guesses are near
calibrated on both (p^1.05-1.10). An overconfident head's trees carry rows that do not pay.

So the engine measures it, as the cost model measures V(rows): after each tree's verification, every node that
was tested (its parent was accepted, or it hangs off the newest token) is a guess with a probability p and an
outcome (accepted or not). Per group of sibling ranks (best guesses; all others) the exponent a that makes p^a
the likeliest hit rate of the recent guesses is refitted every REFIT guesses, once MIN_GUESSES are in, by
maximum likelihood over a grid; the tree builder then multiplies each guess's log-probability by its group's a.
Greedy output never depends on it (trees only change which guesses the target checks), only speed does.
"""
from __future__ import annotations

from collections import deque

import torch

WINDOW = 4096          # recent guesses per group the fit uses
MIN_GUESSES = 256      # a group stays uncalibrated (a = 1) until it has this many
REFIT = 256            # new guesses between fits
GRID = torch.arange(0.5, 3.0001, 0.05, dtype=torch.float64)       # exponents tried


def fit_exponent(logp: torch.Tensor, hit: torch.Tensor) -> float:
    """The a on GRID that maximises the Bernoulli likelihood of hits [N] (bool) under p^a, logp [N] = log p."""
    lq = GRID[:, None] * logp.double().clamp(max=0.0)[None]                             # [A, N] log p^a
    miss = torch.log1p(-lq.exp().clamp(max=1 - 1e-9))
    ll = torch.where(hit[None], lq, miss).sum(-1)
    return round(float(GRID[int(ll.argmax())]), 2)


class TreeCalibration:
    """Online per-rank-group exponents for one head's tree scores; `exponents` is what TreeBuilder takes."""

    def __init__(self):
        self.logp = [deque(maxlen=WINDOW), deque(maxlen=WINDOW)]       # group 0: best guesses; 1: the others
        self.hit = [deque(maxlen=WINDOW), deque(maxlen=WINDOW)]
        self.since = [0, 0]
        self.a = [1.0, 1.0]
        self.pending: dict[int, tuple[list[int], list[float], list[int]]] = {}     # seq id -> its last tree

    def remember(self, seq_id: int, ranks: list[int], logps: list[float], parents: list[int]) -> None:
        """A sequence's tree as drafted (per node in verification order: sibling rank, raw log-probability,
        parent), until its verification comes back (`verified`)."""
        self.pending[seq_id] = (ranks, logps, parents)

    def verified(self, seq_id: int, path: list[int] | None) -> None:
        tree = self.pending.pop(seq_id, None)
        if tree is not None and path is not None:
            self.observe(*tree, path)

    def forget(self, seq_id: int) -> None:
        self.pending.pop(seq_id, None)

    @property
    def exponents(self) -> tuple[float, ...]:
        return () if self.a == [1.0, 1.0] else tuple(self.a)

    def observe(self, ranks: list[int], logps: list[float], parents: list[int], path: list[int]) -> None:
        """One verified tree: per node its sibling rank, raw log-probability and parent (-1: the newest token); path
        the accepted nodes, root side first. Records every tested node."""
        on_path = set(path)
        for i, (r, lp, p) in enumerate(zip(ranks, logps, parents)):
            if p == -1 or p in on_path:
                g = 0 if r == 0 else 1
                self.logp[g].append(lp)
                self.hit[g].append(i in on_path)
                self.since[g] += 1
        for g in (0, 1):
            if len(self.logp[g]) >= MIN_GUESSES and self.since[g] >= REFIT:
                self.a[g] = fit_exponent(torch.tensor(self.logp[g]), torch.tensor(self.hit[g]))
                self.since[g] = 0
