"""Execute: one target forward over every row a step carries, and the learned heads' hidden states routed.

A decoding sequence brings its newest token and its draft (a chain, or a token tree's nodes) as one span; a prompt
chunk brings its tokens (after a preemption, the recomputed output tokens go as decode rows, so that their K/V is
computed exactly as when they were generated). vLLM's and nano-vllm's ModelRunner, for our ragged CPU forward.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..models.kv_manager import KVManager
from ..models.runner import Span, exact_rows, forward_spans
from ..proposers.base import Draft, Proposer
from .sequence import Sequence


@dataclass
class Executed:
    """What one forward gives the verifier."""
    decode_logits: list[torch.Tensor]                  # per decoding sequence  # [1 + draft rows, V]
    decode_hidden: list[dict[int, torch.Tensor] | None]  # per decoding sequence: {layer: [rows, H]} for its head
    prompt_logits: list[torch.Tensor | None]           # per prompt chunk: its last row's [1, V] when it ends the prompt
    prompt_rows: list[torch.Tensor | None]             # per prompt chunk: every prompt row's [n, V], when its
                                                       # request asked for prompt logprobs
    num_rows: int


class ModelRunner:
    def __init__(self, model, kv: KVManager):
        self.model = model
        self.kv = kv
        # every row through the row-by-row attention where that makes a token's K/V independent of how it was
        # computed: a finished answer's K/V is then reusable by the next turn as it stands, with no settling pass
        # (measured on the int4 target: a 2k-token prompt prefills no slower than with flash attention)
        self.exact_rows = exact_rows(model)

    def execute(self, decodes: list[Sequence], drafts: list[Draft], prefills: list[tuple[Sequence, int]],
                reader: Callable[[Sequence], Proposer | None]) -> Executed:
        """One forward. `reader(seq)`: the head that reads the sequence's hidden states, if any; a prompt chunk's
        states go to it here (every row of a chunk is committed), a decode's come back with its logits."""
        heads = {s.seq_id: reader(s) for s in [*decodes, *(s for s, _ in prefills)]}   # asked once per sequence
        spans = [Span(self.kv.get(s.seq_id), s.num_computed, [s.token_ids[-1]] + d.token_ids.tolist(), "all",
                      decode=True, hidden=heads[s.seq_id] is not None, parents=d.row_parents())
                 for s, d in zip(decodes, drafts)]
        last_span, owners = [], []                  # per prefill, the index of its last span; each chunk span's owner
        all_rows: list[int | None] = []             # per prefill, its prompt span whose every row's logits it wants
        for seq, n in prefills:
            lo, hi = seq.num_computed, seq.num_computed + n
            done, cut = hi == len(seq.token_ids), min(max(len(seq.prompt_ids), lo), hi)
            kv = self.kv.get(seq.seq_id)
            wants_rows = seq.prompt_logprobs is not None and cut > lo
            for a, b, decode in ((lo, cut, self.exact_rows), (cut, hi, True)):
                if b > a:
                    mode = "all" if wants_rows and b == cut else "last" if done and b == hi else "none"
                    spans.append(Span(kv, a, seq.token_ids[a:b], mode, decode=decode,
                                      hidden=heads[seq.seq_id] is not None))
                    owners.append(seq)
            last_span.append(len(spans) - 1)
            all_rows.append(len(spans) - 1 - (hi > cut) if wants_rows else None)
        layers = tuple(sorted({i for head in heads.values() if head is not None for i in head.target_hidden}))
        if layers:
            logits, hidden = forward_spans(self.model, spans, layers)
        else:
            logits, hidden = forward_spans(self.model, spans), [None] * len(spans)
        d = len(decodes)
        for seq, span, h in zip(owners, spans[d:], hidden[d:]):
            if h is not None:
                heads[seq.seq_id].accept_hidden(seq.seq_id, span.start, h)
        last = [None if logits[i] is None else logits[i][-1:] if done else None
                for i, done in zip(last_span, (s.num_computed + n == len(s.token_ids) for s, n in prefills))]
        return Executed(logits[:d], hidden[:d], last, [None if i is None else logits[i] for i in all_rows],
                        sum(len(s.token_ids) for s in spans))

    def compute_prompt_rows(self, kv, start: int, token_ids: list[int]) -> None:
        """K/V of `token_ids` at positions start.. as prompt rows, into `kv` (a prefix entry's cache), no logits:
        how an idle engine settles an entry's generated tokens (LLMEngine.settle)."""
        forward_spans(self.model, [Span(kv, start, token_ids, "none", decode=self.exact_rows)])
