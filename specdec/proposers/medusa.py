"""Medusa: K heads over the target's last hidden state guess the next K tokens at once, with no forward of their
own beyond K small matmuls.

The state that matters is the final hidden state of the last committed row (the row whose logits chose the newest
token); the engine hands it over after every target forward (`accept_hidden`). Head j's guess is the draft token
j + 1 places after the newest token. The guesses do not condition on each other, which verification allows: each
q_draft row is a distribution over the draft token at that place given the prefix, as exact rejection sampling
requires (a head's distribution simply ignores the earlier guesses).

A greedy request that asks for a tree (eagle_topk > 1) gets Medusa's tree of candidates: head j's topk best guesses
under each of the topk likeliest nodes of the level above, the likeliest nodes of all of them kept (the scores are
the heads' path probabilities, as Medusa's calibrated choice trees; here picked per step, EAGLE-2 style).
"""
from __future__ import annotations

import torch

from ..models.medusa import MedusaHeads
from .base import BuildContext, Draft, ProposalContext, Proposer, empty_draft, head_draft_token
from .method import Method
from .tree import TreeBuilder


class MedusaProposer(Proposer):
    name = "medusa"

    def __init__(self, heads: MedusaHeads, num_layers: int, vocab_size: int):
        self.heads = heads
        self.vocab_size = vocab_size
        self.target_hidden = (num_layers,)          # the target's final normed hidden state
        self.last: dict[int, tuple[int, torch.Tensor]] = {}   # seq -> (position, hidden [H]) of its last committed row

    def accept_hidden(self, seq_id: int, start: int, hidden: dict[int, torch.Tensor]) -> None:
        rows = hidden[self.target_hidden[0]]
        self.last[seq_id] = (start + rows.shape[0] - 1, rows[-1])

    @torch.inference_mode()
    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        out = [empty_draft() for _ in ctxs]
        live = [(i, min(k, self.heads.cfg.num_heads)) for i, (ctx, k) in enumerate(zip(ctxs, ks))
                if k > 0 and self.last.get(ctx.seq_id, (-1,))[0] == len(ctx.token_ids) - 2]
        if not live:
            return out
        h = torch.stack([self.last[ctxs[i].seq_id][1] for i, _ in live])          # [S, H]
        head_logits = self.heads(h, max(k for _, k in live))                      # per head [S, head vocab]
        tmap = self.heads.token_map
        for row, (i, k) in enumerate(live):
            ctx = ctxs[i]
            if ctx.tree:
                out[i] = self._tree(ctx, ks[i], [lg[row] for lg in head_logits[: min(ctx.depth, k)]])
                continue
            q_rows: list[torch.Tensor] = []
            toks = []
            for j in range(k):
                toks.append(head_draft_token(head_logits[j][row: row + 1], tmap, self.heads.cfg.vocab_size,
                                             self.vocab_size, ctxs[i], q_rows))
            if ctxs[i].constraint is not None:
                ctxs[i].constraint.rollback_draft()
            out[i] = Draft(torch.tensor(toks, dtype=torch.long), torch.stack(q_rows) if q_rows else None)
        return out

    def _tree(self, ctx: ProposalContext, budget: int, logits: list[torch.Tensor]) -> Draft:
        """A tree over the heads' guesses: logits[j] [V'] is head j's, one level per head."""
        b = TreeBuilder(ctx.topk)
        # a head's guesses do not depend on the node they follow: one top-k per level serves every node of it
        top = []
        for lg in logits:
            lp, idx = torch.log_softmax(lg.float(), -1).topk(ctx.topk)
            top.append((lp.tolist(), self.heads.token_map[idx].tolist()))
        b.add_top(-1, *top[0])
        for depth in range(1, len(top)):
            for node in b.pick_frontier(depth):
                b.add_top(node, *top[depth])
        tokens, parents = b.select(budget, ctx.row_cost)
        return Draft(torch.tensor(tokens, dtype=torch.long), None, parents)

    def release(self, seq_id: int) -> None:
        self.last.pop(seq_id, None)

    @property
    def weight_bytes(self) -> int:
        return self.heads.weight_nbytes()


def _build(ctx: BuildContext) -> MedusaProposer | None:
    heads = (ctx.heads or {}).get(METHOD.name)
    return None if heads is None else MedusaProposer(heads, ctx.target.config.num_layers, ctx.vocab_size)


METHOD = Method(MedusaHeads.method, 3, "head", prior_alpha=0.4, tree=True, trainable=True, needs="head", build=_build,
                summary="Medusa: K heads over the target's last hidden state guess the next K tokens at once")
