"""A smaller model of the same family drafts k tokens autoregressively with its own KV cache."""
from __future__ import annotations

import torch

from ..errors import SpecDecError
from ..models.kv_cache import KVCache
from ..models.qwen2 import Transformer
from ..sampling.logits import probs_from_logits, sample
from ..tokenizer import Tokenizer
from .base import Draft, ProposalContext, Proposer, VerifyResult


def check_compatible(target_tok: Tokenizer, draft_tok: Tokenizer, target_vocab: int, draft_vocab: int) -> None:
    """Refuse a draft whose tokens mean something else to the target (llama.cpp's are_compatible)."""
    if target_tok.vocab_size != draft_tok.vocab_size:
        raise SpecDecError(f"draft and target vocabularies differ: target tokenizer has {target_tok.vocab_size} "
                           f"tokens, draft has {draft_tok.vocab_size}")
    if sorted(target_tok.eos_token_ids) != sorted(draft_tok.eos_token_ids):
        raise SpecDecError(f"draft and target special tokens differ: eos {target_tok.eos_token_ids} vs "
                           f"{draft_tok.eos_token_ids}")
    if target_tok.bos_token_id != draft_tok.bos_token_id:
        raise SpecDecError(f"draft and target special tokens differ: bos {target_tok.bos_token_id} vs "
                           f"{draft_tok.bos_token_id}")
    if min(target_vocab, draft_vocab) < target_tok.vocab_size:
        raise SpecDecError(f"model output heads ({target_vocab}, {draft_vocab}) are smaller than the "
                           f"tokenizer vocabulary ({target_tok.vocab_size})")
    tv, dv = target_tok._tok.get_vocab(with_added_tokens=True), draft_tok._tok.get_vocab(with_added_tokens=True)
    if tv != dv:
        diff = min(t for t in tv.keys() | dv.keys() if tv.get(t) != dv.get(t))
        raise SpecDecError(f"draft and target token text differs: token {diff!r} is id {tv.get(diff)} in the "
                           f"target and id {dv.get(diff)} in the draft")


class DraftModelProposer(Proposer):
    """Keeps one KV cache per sequence, in sync with the committed tokens.

    The cache holds a prefix of the committed tokens. `propose` first feeds whatever committed tokens
    the cache lacks (the prompt on the first call; after a fully accepted draft, the last draft token
    plus the bonus token) in one forward, then drafts k tokens one at a time. After verification,
    `observe` rolls the cache back to the committed prefix (O(1)).
    """
    name = "draft"

    def __init__(self, model: Transformer, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size                 # compare on the shared vocabulary
        self.caches: dict[int, KVCache] = {}

    def _cache(self, seq_id: int, needed: int) -> KVCache:
        cache = self.caches.get(seq_id)
        if cache is None or cache.max_len < needed:
            # headroom so a request rarely regrows; a regrown cache starts empty and is refilled below
            cache = self.model.new_kv_cache(needed + 1024)
            self.caches[seq_id] = cache
        return cache

    @torch.inference_mode()
    def propose(self, ctx: ProposalContext, k: int) -> Draft:
        if k <= 0:
            return Draft(torch.empty(0, dtype=torch.long))
        ids = ctx.token_ids
        cache = self._cache(ctx.seq_id, len(ids) + k + 1)
        device = self.model.embed_tokens.weight.device
        params = ctx.params
        missing = ids[cache.length:]                  # committed tokens the draft has not seen
        tokens = torch.tensor([missing], dtype=torch.long, device=device)
        drafted, q_rows = [], []
        for i in range(k):
            start = cache.length
            positions = torch.arange(start, start + tokens.shape[1], device=device)[None]
            hidden = self.model(tokens, positions, cache)
            logits = self.model.compute_logits(hidden[0, -1:])[:, : self.vocab_size]  # [1, V]
            if params.greedy:
                tok = logits.argmax(-1)
            else:
                q = probs_from_logits(logits, params.temperature, params.top_k, params.top_p, params.min_p)
                tok = sample(q, ctx.generator)
                q_rows.append(q[0])
            drafted.append(tok)
            tokens = tok.view(1, 1)
        # The cache now holds ids + drafted[:-1]; the last draft token is fed next time if accepted.
        token_ids = torch.cat(drafted)
        return Draft(token_ids, torch.stack(q_rows) if q_rows else None)

    def observe(self, result: VerifyResult) -> None:
        cache = self.caches.get(result.seq_id)
        if cache is not None and cache.length > result.committed_len - 1:
            # keep only committed tokens (the newest committed token is fed at the next propose)
            cache.rollback(result.committed_len - 1)

    def release(self, seq_id: int) -> None:
        self.caches.pop(seq_id, None)

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_nbytes()

    @property
    def cache_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches.values())
