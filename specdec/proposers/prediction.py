"""Method predicted_outputs (OpenAI's Predicted Outputs, the request field `prediction`): the client sends the text
it expects back -- the file it asked to edit, a document to rewrite -- and it is proposed as the draft, k tokens at
a time, the way prompt lookup proposes from the prompt. Exact like every method: the target verifies each draft
token (a one-hot q under sampling), so a wrong prediction costs time, never a different answer.

Where the answer departs from the prediction (the edit itself), the proposer re-syncs: it looks for the longest
tail of the sequence (up to RESYNC_MAX tokens) that occurs in the prediction, nearest after where it was, and
proposes what follows that occurrence; with no such match it proposes nothing until one appears.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from .base import Draft, ProposalContext, Proposer
from .method import Method

RESYNC_MAX = 12       # longest tail searched for after a divergence
RESYNC_MIN = 2        # a shorter match says too little about where the answer is in the prediction


class PredictionProposer(Proposer):
    free = True                       # no forward: asked while the step is planned

    def __init__(self):
        # per sequence: (position in the prediction the next token should be, sequence length it was synced at)
        self.at: dict[int, tuple[int | None, int]] = {}
        self._lock = threading.Lock()     # status() is read from the server's thread
        self.requests = self.proposed = 0

    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        out = []
        for ctx, k in zip(ctxs, ks):
            guess = self.guess(ctx, k) if k > 0 and ctx.prediction else []
            if ctx.constraint is not None:
                guess = guess[:ctx.constraint.valid_prefix(guess)]
            out.append(Draft(torch.tensor(guess, dtype=torch.long)))
        with self._lock:
            self.proposed += sum(len(d) for d in out)
        return out

    def guess(self, ctx: ProposalContext, k: int) -> list[int]:
        pred, ids, n = ctx.prediction, ctx.token_ids, len(ctx.token_ids)
        if ctx.seq_id not in self.at:
            # the first decode step: the answer so far is its first token, and it should open the prediction
            self.at[ctx.seq_id] = (0, n - 1)
            with self._lock:
                self.requests += 1
        pos, synced = self.at[ctx.seq_id]
        new = ids[synced:n]
        if pos is not None and pred[pos:pos + len(new)] == new:
            pos += len(new)                                    # still following the prediction
        else:
            pos = resync(pred, ids, pos)
        self.at[ctx.seq_id] = (pos, n)
        return [] if pos is None else list(pred[pos:pos + k])

    def release(self, seq_id: int) -> None:
        self.at.pop(seq_id, None)

    def status(self) -> dict:
        with self._lock:
            return {"requests": self.requests, "proposed_tokens": self.proposed}


def resync(pred: list[int], ids: list[int], near: int | None) -> int | None:
    """Where in the prediction the sequence's tail continues: the end of the longest tail (RESYNC_MIN..RESYNC_MAX
    tokens) occurring in it, the occurrence nearest after `near` (else the first); None when none occurs."""
    p = np.asarray(pred, dtype=np.int64)
    for m in range(min(RESYNC_MAX, len(ids), len(pred)), RESYNC_MIN - 1, -1):
        tail = np.asarray(ids[-m:], dtype=np.int64)
        windows = np.lib.stride_tricks.sliding_window_view(p, m)
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            ends = hits + m
            after = ends[ends >= (near or 0)]
            return int(after[0] if after.size else ends[0])
    return None


# k 8: like prompt lookup, a draft costs nothing to make, and a verification row a few ms at long context
METHOD = Method("predicted_outputs", 8, "lookup", prior_alpha=0.5, build=lambda ctx: PredictionProposer(),
                auto_candidate=False,
                summary="predicted outputs (OpenAI's `prediction`): the request's expected text proposed as the "
                        "draft, re-synced after each divergence")
