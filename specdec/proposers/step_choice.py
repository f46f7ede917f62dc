"""Drafting by a step controller: the proposer of method hybrid, and of a request method auto runs with a model
proposer and prompt lookup side by side.

Each step, the request's controller (policy/decide.py's StepController, on its ProposalContext) picks the model
proposer and its k, or prompt lookup's guess, knowing the rows the step already carries (the context's budget); this
proposer then drafts through what was picked -- the requests that picked one model proposer in one call -- and after
verification tells the controller how the step went. It drafts nothing itself, so the engine asks it like any other
proposer and its step has one drafting path.
"""
from __future__ import annotations

import dataclasses

import torch

from .base import Draft, ProposalContext, Proposer, VerifyResult, empty_draft


class StepChoiceProposer(Proposer):
    name = "step-choice"

    def __init__(self, proposers: dict[str, Proposer]):
        self.proposers = proposers           # the engine's loaded proposers, by method (what a controller picks among)
        self._planned: dict[int, object] = {}   # seq_id -> its controller, for each step it planned (observe)

    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        """ks[i]: the room the step leaves the sequence (0: a plain step, its controller still scores its guess)."""
        drafts = [empty_draft() for _ in ctxs]
        wanted: dict[str, list[tuple[int, ProposalContext, int]]] = {}
        for i, (ctx, room) in enumerate(zip(ctxs, ks)):
            ctl = ctx.controller
            self._planned[ctx.seq_id] = ctl
            if room <= 0:
                continue
            name, k, guess = ctl.choose_step(ctx.token_ids, room, ctx.constraint, ctx.budget, ctx.p_min)
            if guess is not None:            # prompt lookup's guess, already made
                drafts[i] = Draft(torch.tensor(guess, dtype=torch.long), source=name)
            elif k > 0 and name in self.proposers:
                wanted.setdefault(name, []).append((i, dataclasses.replace(ctx, depth=min(ctx.depth, k)), k))
        for name, asked in wanted.items():
            made = self.proposers[name].propose([ctx for _, ctx, _ in asked], [k for _, _, k in asked])
            for (i, _, _), draft in zip(asked, made):
                draft.source = name
                drafts[i] = draft
        return drafts

    def observe(self, result: VerifyResult) -> None:
        ctl = self._planned.pop(result.seq_id, None)
        if ctl is not None:                  # a step it planned (not one the grammar forced)
            ctl.observe_step(result.num_draft, result.num_accepted, result.emitted)

    def release(self, seq_id: int) -> None:
        self._planned.pop(seq_id, None)
