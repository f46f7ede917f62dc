"""A draft model with another tokenizer (Gemma 3 270M drafting for a Qwen2.5 target): verification stays in the
target's token space, and no draft id ever reaches the target.

- `VocabMap` pairs the tokens of the two vocabularies that stand for the same bytes (not the same strings: a
  byte-level BPE spells a space "Ġ", SentencePiece "▁", and a byte `<0xE4>`); control tokens pair with nothing.
- The draft's output head is cut to the paired rows, so every token it proposes is one target token, and a sampled
  request's q is the draft's distribution renormalised over the pairs (scattered into the target's vocabulary,
  zero elsewhere): the usual verifier then keeps the target's distribution exactly; a greedy draft is one-hot.
- The draft reads the target's text: each step the target tokens it has not seen become bytes, the complete UTF-8
  prefix of those is tokenized by the draft's tokenizer and fed (a byte-level token may end inside a character:
  those bytes wait for the next token). An accepted draft token is one target token, so after verification the
  draft keeps its cache up to the accepted tokens and re-reads only the bonus token's text: each model rolls back in
  its own positions.
"""
from __future__ import annotations

import codecs
import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import SpecDecError
from ..models.kv_manager import KVManager
from ..models.runner import Span, forward_spans
from ..tokenizer import Tokenizer
from .base import BuildContext, Draft, ProposalContext, Proposer, VerifyResult, empty_draft, head_draft_token
from .draft_model import catch_up
from .method import Method

# Bytes alone do not count: every byte-level vocabulary has all 256 of them. A draft that shares fewer than this
# share of its multi-byte tokens with the target could only spell the target's text a byte at a time.
MIN_SHARED_FRACTION = 0.05


class VocabMap:
    """The tokens two tokenizers share by their bytes: draft_ids[j] <-> target_ids[j], one to one."""

    def __init__(self, target: Tokenizer, draft: Tokenizer):
        by_bytes: dict[bytes, int] = {}
        skip = set(target.control_token_ids())
        for tid in range(target.vocab_size):
            if tid not in skip and target.id_to_token(tid) is not None:
                by_bytes.setdefault(target.token_bytes(tid), tid)
        by_bytes.pop(b"", None)
        skip = set(draft.control_token_ids())
        spelled = {did: draft.token_bytes(did) for did in range(draft.vocab_size)
                   if did not in skip and draft.id_to_token(did) is not None}
        pairs, taken = [], set()
        for did, text in spelled.items():
            tid = by_bytes.get(text)
            if tid is not None and tid not in taken:
                taken.add(tid)
                pairs.append((did, tid))
        self.draft_ids = torch.tensor([d for d, _ in pairs], dtype=torch.long)
        self.target_ids = torch.tensor([t for _, t in pairs], dtype=torch.long)
        self.draft_of = {t: d for d, t in pairs}
        self.target_vocab, self.draft_vocab = target.vocab_size, draft.vocab_size
        self.draft_words = sum(len(text) > 1 for text in spelled.values())
        self.shared_words = sum(len(spelled[d]) > 1 for d, _ in pairs)

    def __len__(self) -> int:
        return len(self.draft_of)

    def check(self) -> None:
        """Refuse a pair that shares too little to draft with (one line)."""
        if self.shared_words < max(16, MIN_SHARED_FRACTION * self.draft_words):
            raise SpecDecError(f"the draft shares {self.shared_words} of its {self.draft_words} multi-byte tokens "
                               f"with the target (by their bytes; at least {MIN_SHARED_FRACTION:.0%} needed): it could "
                               "not propose the target's text")


@functools.lru_cache(maxsize=4)
def vocab_map_of(target: Tokenizer, draft: Tokenizer) -> VocabMap:
    """The map of a tokenizer pair, built once (a second or two for two 150k+ vocabularies)."""
    return VocabMap(target, draft)


@dataclass
class _Reader:
    """How far the draft has read a sequence: target tokens turned into its own ids, and bytes still waiting."""
    target_len: int = 0                  # target tokens read
    ids: list[int] = field(default_factory=list)   # the draft's ids for them (its cache holds a prefix of these)
    drafted_from: int = 0                # len(ids) when the last draft began (its tokens follow)
    # the target's bytes as text: holds back those that do not end a UTF-8 character yet
    utf8: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))

    @property
    def pending(self) -> bool:
        return bool(self.utf8.getstate()[0])


class CrossVocabProposer(Proposer):
    name = "cross_vocab"

    def __init__(self, model, vocab_map: VocabMap, target_tok: Tokenizer, draft_tok: Tokenizer, kv: KVManager,
                 catchup_budget: int = 512):
        self.model, self.map, self.kv = model, vocab_map, kv
        self.target_tok, self.draft_tok = target_tok, draft_tok
        self.catchup_budget = catchup_budget
        self.readers: dict[int, _Reader] = {}
        # the output head cut to the shared rows: most of a small model's head is tokens the target cannot take. Its
        # weights are the embedding's for a tied head, a plain linear's own; a quantized untied head (no float rows
        # to cut) computes every row and keeps the shared ones
        lm_head = getattr(model, "lm_head", None)
        rows = model.embed_tokens.weight if model.config.tie_word_embeddings else \
            lm_head.weight if isinstance(lm_head, torch.nn.Linear) else None
        self.head = None if rows is None else rows.detach()[vocab_map.draft_ids.to(rows.device)].contiguous()  # [M, H]

    def _read(self, seq_id: int, ids: list[int]) -> _Reader:
        """Bring the sequence's reader up to the target's committed tokens (all but the newest are verified; the
        newest is read too: the draft continues after it)."""
        r = self.readers.get(seq_id)
        if r is None or r.target_len > len(ids):
            r = self.readers[seq_id] = _Reader()
            if self.draft_tok.add_bos and self.draft_tok.bos_token_id is not None:
                r.ids.append(self.draft_tok.bos_token_id)
        text = r.utf8.decode(b"".join(self.target_tok.token_bytes(t) for t in ids[r.target_len:]))
        if text:
            r.ids += self.draft_tok.encode_text(text)
        r.target_len = len(ids)
        return r

    @torch.inference_mode()
    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        out: list[Draft] = [empty_draft() for _ in ctxs]
        drafted: list[list[int]] = [[] for _ in ctxs]
        q_rows: list[list[torch.Tensor]] = [[] for _ in ctxs]
        spans, owners, budget = [], [], self.catchup_budget
        for i, (ctx, k) in enumerate(zip(ctxs, ks)):
            if k <= 0 or ctx.constraint is not None:     # a grammar's masks are over the target's tokens only
                continue
            r = self._read(ctx.seq_id, ctx.token_ids)
            kv = self.kv.get(ctx.seq_id)
            if kv.length > len(r.ids):
                self.kv.truncate(ctx.seq_id, len(r.ids))
            if kv.length >= len(r.ids):                  # something must be fed to draft after it
                self.kv.truncate(ctx.seq_id, max(0, len(r.ids) - 1))
            missing = r.ids[kv.length:]
            if r.pending or not missing:                 # mid-character: the draft would continue the wrong text
                continue
            if len(missing) > max(budget, 1):            # a long prompt: catch up by a chunk, draft next time
                budget = catch_up(self.kv, ctx.seq_id, kv, missing, budget, spans, owners)
                continue
            budget -= len(missing)
            r.drafted_from = len(r.ids)
            self.kv.ensure(ctx.seq_id, len(r.ids) + k)
            spans.append(Span(kv, kv.length, missing, "none", decode=len(missing) <= 16, hidden=True))
            owners.append(i)
        top = self.model.config.num_layers
        while spans:
            _, hidden = forward_spans(self.model, spans, aux_layers=(top,))
            nxt, nxt_owners = [], []
            for span, i, h in zip(spans, owners, hidden):
                span.kv.length = max(span.kv.length, span.start + len(span.token_ids))
                if i is None:
                    continue
                last = h[top][-1:]
                logits = F.linear(last, self.head).float() if self.head is not None else \
                    self.model.compute_logits(last)[:, self.map.draft_ids]             # [1, M]: the shared tokens
                tok = head_draft_token(logits, self.map.target_ids, len(self.map), self.map.target_vocab, ctxs[i],
                                       q_rows[i])
                drafted[i].append(tok)
                if len(drafted[i]) < ks[i]:
                    nxt.append(Span(span.kv, span.kv.length, [self.map.draft_of[tok]], "none", decode=True,
                                    hidden=True))
                    nxt_owners.append(i)
            spans, owners = nxt, nxt_owners
        for i, d in enumerate(drafted):
            if d:
                q = q_rows[i]
                out[i] = Draft(torch.tensor(d, dtype=torch.long), torch.stack(q) if q else None)
                self.readers[ctxs[i].seq_id].ids += [self.map.draft_of[t] for t in d]
        return out

    def observe(self, result: VerifyResult) -> None:
        """Keep what the target committed of the draft: each accepted token is one target token and one draft
        token; the bonus (or recovered) token is read as text at the next step."""
        r = self.readers.get(result.seq_id)
        if r is None:
            return
        if result.num_draft:
            keep = r.drafted_from + result.num_accepted
            del r.ids[keep:]
            r.target_len = result.committed_len - 1
        kv = self.kv.caches.get(result.seq_id)
        if kv is not None and kv.length > len(r.ids):
            self.kv.truncate(result.seq_id, len(r.ids))

    def release(self, seq_id: int) -> None:
        self.readers.pop(seq_id, None)
        self.kv.free_seq(seq_id)

    def status(self) -> dict:
        return {"shared_tokens": len(self.map), "target_vocab": self.map.target_vocab,
                "draft_vocab": self.map.draft_vocab}

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_nbytes() + (0 if self.head is None else self.head.nbytes)

    @property
    def cache_bytes(self) -> int:
        return self.kv.nbytes


def _build(ctx: BuildContext) -> CrossVocabProposer | None:
    if ctx.draft_model is None or ctx.draft_tokenizer is None or ctx.target_tokenizer is None:
        return None
    vocab_map = vocab_map_of(ctx.target_tokenizer, ctx.draft_tokenizer)
    vocab_map.check()
    return CrossVocabProposer(ctx.draft_model, vocab_map, ctx.target_tokenizer, ctx.draft_tokenizer,
                              KVManager(ctx.draft_model, ctx.max_total_tokens), ctx.max_batched_tokens)


METHOD = Method("cross_vocab", 4, "model", prior_alpha=0.5, needs="draft_model", build=_build,
                summary="a draft model with another tokenizer: its proposals become target tokens through the tokens "
                        "both vocabularies share by their bytes (Universal Assisted Generation's idea)")
