"""The one interface every proposer implements: propose drafts for a step's sequences, observe how they fared.

A proposer gets every sequence it drafts for in one call, so a model proposer can draft for all of them in shared
batched forwards (vLLM's flat draft batches); per-sequence proposers simply loop.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..sampling_params import SamplingParams


@dataclass
class ProposalContext:
    """What a proposer may look at: the sequence so far and how it is sampled."""
    seq_id: int
    token_ids: list[int]                   # prompt + output so far (the last one not yet verified-in)
    params: SamplingParams
    generator: torch.Generator | None
    constraint: object | None = None       # sampling.grammar.Constraint: draft only what the grammar allows


@dataclass
class Draft:
    token_ids: torch.Tensor                # [k'] proposed tokens, k' <= k (0: nothing to propose)
    q_draft: torch.Tensor | None = None    # [k', V] the draft's (processed) probabilities; None = one-hot

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class VerifyResult:
    """What verification made of a draft; proposers may adapt to it."""
    seq_id: int
    num_draft: int
    num_accepted: int
    committed_len: int                     # tokens in the sequence after this step


class Proposer(ABC):
    name: str = "base"

    @abstractmethod
    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        """For each sequence, up to ks[i] tokens to follow ctxs[i].token_ids (fewer, or none, is allowed)."""

    def observe(self, result: VerifyResult) -> None:
        """Called after each verification (default: nothing to learn)."""

    def release(self, seq_id: int) -> None:
        """The sequence has finished; free anything kept for it."""

    @property
    def weight_bytes(self) -> int:
        return 0

    @property
    def cache_bytes(self) -> int:
        return 0


class NoProposer(Proposer):
    """`none`: plain decoding through the same engine; every step is a k=0 step."""
    name = "none"

    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        return [empty_draft() for _ in ctxs]


def empty_draft() -> Draft:
    return Draft(torch.empty(0, dtype=torch.long))
