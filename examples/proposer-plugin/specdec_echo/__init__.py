"""Method `echo`, a specdec proposer plugin: draft the k tokens that followed the newest token's previous
occurrence in the sequence (a one-token prompt lookup that always takes the latest match).

Everything a method is lives here: the proposer, and its declaration (`METHOD`), which `pyproject.toml` names in
the `specdec.proposers` entry-point group. Installed, `echo` works wherever a built-in method does: `LLM`,
`specdec generate --method echo`, `specdec serve --speculative-config '{"method": "echo"}'` and per request
(`"speculative": {"method": "echo"}`), `specdec bench offline --methods echo`, /v1/speculative/status, and method
auto, which weighs it as a free proposer (kind "lookup").
"""
from __future__ import annotations

import threading

import torch

from specdec import BuildContext, Method, Proposer
from specdec.proposers import Draft, ProposalContext


class EchoProposer(Proposer):
    free = True                       # no forward: the engine asks it while it plans the step

    def __init__(self):
        self._lock = threading.Lock()     # the server reads status() from another thread
        self.proposals = 0
        self.proposed_tokens = 0

    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        drafts = []
        for ctx, k in zip(ctxs, ks):
            ids = ctx.token_ids
            guess: list[int] = []
            if k > 0 and len(ids) > 1:
                last = ids[-1]
                at = next((i for i in range(len(ids) - 2, -1, -1) if ids[i] == last), None)
                if at is not None:
                    guess = ids[at + 1:at + 1 + k]
            if ctx.constraint is not None:          # a grammar: draft only the prefix it allows
                guess = guess[:ctx.constraint.valid_prefix(guess)]
            drafts.append(Draft(torch.tensor(guess, dtype=torch.long)))
        with self._lock:
            self.proposals += len(ctxs)
            self.proposed_tokens += sum(len(d) for d in drafts)
        return drafts

    def status(self) -> dict:
        with self._lock:
            return {"proposals": self.proposals, "proposed_tokens": self.proposed_tokens}


def build(ctx: BuildContext) -> EchoProposer:
    return EchoProposer()


METHOD = Method("echo", 6, "lookup", prior_alpha=0.2, build=build,
                summary="example plugin: what followed the newest token's previous occurrence")
