"""The decode loop: propose -> verify (one target forward over k+1 tokens) -> commit.

One request at a time for now; a request is a `Sequence` and every phase is a method taking one, so a
scheduler that interleaves or batches sequences can drive the same steps later.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..errors import SpecDecError
from ..metrics.stats import RequestStats
from ..models.kv_cache import KVCache
from ..models.qwen2 import Transformer
from ..proposers.base import Draft, NoProposer, ProposalContext, Proposer, VerifyResult
from ..proposers.ngram import NgramProposer
from ..sampling.logits import probs_from_logits, sample
from ..sampling.rejection import verify_greedy, verify_sampling
from ..sampling_params import SamplingParams
from ..tokenizer import Tokenizer
from .sequence import Sequence


@dataclass
class StreamDelta:
    text: str                       # new text (never half a character; stop strings held back)
    token_ids: list[int]            # tokens committed in this step
    finished: bool
    finish_reason: str | None
    stats: RequestStats | None = None   # set on the last delta


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stats: RequestStats


class Engine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, proposer: Proposer | None = None,
                 num_speculative_tokens: int = 0, max_model_len: int | None = None,
                 lookup: NgramProposer | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.proposer = proposer or NoProposer()
        # prompt lookup offered to a sequence's step controller next to the proposer (method "auto")
        self.lookup = lookup
        speculates = not isinstance(self.proposer, NoProposer) or lookup is not None
        self.k = num_speculative_tokens if speculates else 0
        self.vocab_size = tokenizer.vocab_size      # shared with the draft; padding rows never sampled
        self.max_model_len = min(max_model_len or model.config.max_position_embeddings,
                                 model.config.max_position_embeddings)
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.device = model.embed_tokens.weight.device

    @property
    def method(self) -> str:
        return self.proposer.name

    # -- public ---------------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> RequestOutput:
        seq = self.new_sequence(prompt_ids, params)
        for _ in self.run(seq):
            pass
        return RequestOutput(seq.prompt_ids, list(seq.output_ids), seq.text, seq.finish_reason, seq.stats)

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[StreamDelta]:
        yield from self.run(self.new_sequence(prompt_ids, params))

    def new_sequence(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        if not prompt_ids:
            raise SpecDecError("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise SpecDecError(f"the prompt is {len(prompt_ids)} tokens; the context window is {self.max_model_len} "
                               "tokens (the prompt and at least one new token must fit)")
        seq = Sequence(prompt_ids, params, self.tokenizer, self.eos_ids, self.max_model_len)
        seq.stats.method, seq.stats.num_speculative_tokens = self.method, self.k
        seq.stats.prompt_tokens = len(prompt_ids)
        return seq

    def run(self, seq: Sequence) -> Iterator[StreamDelta]:
        """Prefill, then decode steps until the sequence finishes; one delta per step."""
        start = time.perf_counter()
        capacity = min(self.max_model_len, len(seq.prompt_ids) + seq.params.max_tokens + self.k + 1)
        cache = self.model.new_kv_cache(capacity)
        try:
            new = self._prefill(seq, cache)
            first_token_at = time.perf_counter()
            while not seq.finished:
                yield StreamDelta(seq.take_delta(), new, False, None)
                new = self._decode_step(seq, cache)
            seq.stats.finish_reason = seq.finish_reason
            seq.stats.finalize(start, first_token_at, time.perf_counter())
            yield StreamDelta(seq.take_delta(), new, True, seq.finish_reason, seq.stats)
        finally:
            # both caches hold exactly the committed tokens (the target's is dropped with the request)
            cache.rollback(min(cache.length, len(seq.token_ids) - 1))
            self.proposer.release(seq.seq_id)

    def _sample_row(self, logits: torch.Tensor, seq: Sequence) -> int:
        # logits: [1, V]
        if seq.params.greedy:
            return int(logits.argmax(-1))
        p = seq.params
        return int(sample(probs_from_logits(logits, p.temperature, p.top_k, p.top_p, p.min_p), seq.generator))

    def _prefill(self, seq: Sequence, cache: KVCache) -> list[int]:
        t0 = time.perf_counter()
        ids = torch.tensor([seq.prompt_ids], dtype=torch.long, device=self.device)
        positions = torch.arange(len(seq.prompt_ids), device=self.device)[None]
        hidden = self.model(ids, positions, cache)
        logits = self.model.compute_logits(hidden[0, -1:])[:, : self.vocab_size]
        first = self._sample_row(logits, seq)
        seq.stats.prefill_time_s = time.perf_counter() - t0
        return seq.append([first])

    def _decode_step(self, seq: Sequence, cache: KVCache) -> list[int]:
        """One target forward: verify a draft of up to k tokens (k = 0: a plain step).

        With a step controller on the sequence (method "auto"), the controller picks, before each step, the
        proposer's k or the prompt-lookup guess, and is told afterwards how both fared.
        """
        stats, params, ctl = seq.stats, seq.params, seq.controller
        # Drafting past max_tokens or the cache is wasted work.
        remaining = min(params.max_tokens - len(seq.output_ids), cache.max_len - cache.length) - 1
        room = max(0, min(self.k, remaining))
        t0 = time.perf_counter()
        n, guess, source, k = 0, [], "draft", room
        if ctl is not None:
            if self.lookup is not None:
                n, guess = self.lookup.match(seq.token_ids, room)
            source, k = ctl.plan(n, len(guess))
            k = max(0, min(k, room))
        if source == "lookup":
            draft = Draft(torch.tensor(guess[:k], dtype=torch.long))
        elif k > 0:
            draft = self.proposer.propose(ProposalContext(seq.seq_id, seq.token_ids, params, seq.generator), k)
        else:
            draft = Draft(torch.empty(0, dtype=torch.long))
        t1 = time.perf_counter()
        draft_ids = draft.token_ids.to(self.device)                          # [k']
        pending = torch.tensor([seq.token_ids[-1]], dtype=torch.long, device=self.device)
        tokens = torch.cat([pending, draft_ids])[None]                      # [1, k'+1]
        base = cache.length
        positions = torch.arange(base, base + tokens.shape[1], device=self.device)[None]
        hidden = self.model(tokens, positions, cache)
        logits = self.model.compute_logits(hidden[0])[:, : self.vocab_size]  # [k'+1, V]
        if params.greedy:
            num_accepted, emitted = verify_greedy(logits.argmax(-1), draft_ids)
        else:
            p_target = probs_from_logits(logits, params.temperature, params.top_k, params.top_p, params.min_p)
            q_draft = (None if source == "lookup" or draft.q_draft is None
                       else draft.q_draft[:, : self.vocab_size].to(self.device))
            num_accepted, emitted = verify_sampling(p_target, q_draft, draft_ids, seq.generator)
        # The pending token and the accepted drafts are now in the cache; the emitted last token is not.
        cache.rollback(base + 1 + num_accepted)
        t2 = time.perf_counter()
        stats.target_forwards += 1
        stats.draft_time_s += t1 - t0
        stats.verify_time_s += t2 - t1
        stats.observe_draft(len(draft), num_accepted)
        emitted = emitted.tolist()
        if ctl is not None:
            if source == "lookup":
                stats.lookup_steps += 1
                matched = num_accepted
            else:   # how the guess would have fared: its agreement with what the target committed
                matched = next((i for i, (g, e) in enumerate(zip(guess, emitted)) if g != e),
                               min(len(guess), len(emitted)))
            ctl.observe(source, len(draft), num_accepted, n, len(guess), matched)
        committed = seq.append(emitted)
        self.proposer.observe(VerifyResult(seq.seq_id, len(draft), num_accepted, len(seq.token_ids)))
        return committed
