"""Commit: what verification decided becomes each sequence's state. The step's fifth stage, one object.

For a prompt chunk: its positions count as computed. For a sequence that sampled this step: a token tree's accepted
path moves into place in the KV cache, the newest token and the accepted drafts count as computed (a rejected
draft's K/V is simply not counted), the emitted tokens are appended (stop conditions are checked there), the head
reading the sequence gets the kept rows' hidden states, the grammar advances, logprobs are computed, and the
proposers hear how the draft fared (a step controller through the proposer that asked it). Finishing a request
(prefix entry, suffix pools, the policy) stays with the engine, which owns the request table.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..models.kv_manager import KVManager
from ..proposers.base import Draft, Proposer, VerifyResult, empty_draft
from ..proposers.registry import lookup_method
from ..sampling.logprobs import token_logprobs
from .sequence import Sequence

FORCED = "forced"      # a Plan's source when the grammar's next tokens are verified without drafting


@dataclass
class Plan:
    """One decoding sequence's part of a step: what it verifies and where that came from."""
    draft: Draft = field(default_factory=empty_draft)
    source: str = ""                      # the proposer that filled `draft` (its method), FORCED, or "" (plain)


@dataclass
class StepTimes:
    start: float                          # the step began
    proposed: float                       # drafts made
    verified: float                       # forward and verification done


class Committer:
    def __init__(self, kv: KVManager, vocab_size: int, uses: Callable[[Sequence], list[Proposer]],
                 reader: Callable[[Sequence], Proposer | None]):
        self.kv = kv
        self.vocab_size = vocab_size
        self.uses = uses                  # the proposers that may draft for a sequence (they observe its steps)
        self.reader = reader              # the head reading a sequence's hidden states, if any

    def prompt_chunk(self, seq: Sequence, n: int) -> None:
        """A prompt chunk of n positions was computed."""
        seq.num_computed += n
        self.kv.commit(seq.seq_id, seq.num_computed)

    def sampled(self, seq: Sequence, plan: Plan | None, logits: torch.Tensor, num_accepted: int, emitted: list[int],
                kept: list[int] | None, hidden: dict[int, torch.Tensor] | None, times: StepTimes
                ) -> tuple[list[int], list | None]:
        """A sequence that sampled this step (plan None: its prompt's last chunk ran). Returns the committed tokens
        (fewer than emitted when a stop condition cut them) and their logprobs, when asked for."""
        start = seq.num_computed
        if kept is not None:                     # a tree: its accepted path's K/V moves into place
            self.kv.compact(seq.seq_id, start, kept)
            logits = logits[torch.tensor(kept, device=logits.device)]
        committed = self._tokens(seq, plan, num_accepted, emitted, times)
        # asked after the step's observations: a request that just moved from its head to the draft model has none
        reader = self.reader(seq) if plan is not None and hidden is not None and not seq.finished else None
        if reader is not None:
            # the newest token and the accepted drafts: the rows whose K/V the target kept
            rows = slice(0, 1 + num_accepted) if kept is None else torch.tensor(kept)
            reader.accept_hidden(seq.seq_id, start, {i: h[rows] for i, h in hidden.items()})
        if seq.constraint is not None:
            seq.constraint.commit(committed)
        lps = None
        if seq.params.logprobs is not None:     # row i of logits is the distribution emitted[i] came from
            lps = token_logprobs(logits[:len(committed), :self.vocab_size], committed, seq.params.logprobs)
            seq.logprobs = (seq.logprobs or []) + lps
        return committed, lps

    def _tokens(self, seq: Sequence, plan: Plan | None, num_accepted: int, emitted: list[int],
                times: StepTimes) -> list[int]:
        stats = seq.stats
        if plan is None:                                  # the first token, sampled from the prompt's last row
            stats.prefill_time_s += times.verified - times.start
            return seq.append(emitted)
        # the newest token and the accepted drafts now have K/V; the emitted last token does not
        seq.num_computed += 1 + num_accepted
        self.kv.commit(seq.seq_id, seq.num_computed)     # rejected drafts' K/V is simply not counted
        num_draft = plan.draft.depth                     # a tree counts by the positions it can fill
        stats.target_forwards += 1
        stats.draft_time_s += times.proposed - times.start
        stats.verify_time_s += times.verified - times.proposed
        stats.observe_draft(num_draft, num_accepted)
        if plan.source == FORCED:
            stats.forced_steps += 1
            stats.forced_tokens += num_accepted
        elif plan.source == lookup_method() and num_draft:
            stats.lookup_steps += 1
        committed = seq.append(emitted)
        result = VerifyResult(seq.seq_id, num_draft, num_accepted, len(seq.token_ids), list(emitted))
        for proposer in self.uses(seq):
            proposer.observe(result)
        return committed
