"""One factory for the learned heads' proposers (the engine builds them from the loaded head modules)."""
from __future__ import annotations

from .base import Proposer


def make_head_proposer(method: str, head, target, vocab_size: int, max_total_tokens: int) -> Proposer:
    proposer = _make(method, head, target, vocab_size, max_total_tokens)
    proposer.name = method                          # EAGLE-1 runs EAGLE-3's class; prefix entries key caches by it
    return proposer


def _make(method: str, head, target, vocab_size: int, max_total_tokens: int) -> Proposer:
    if method == "eagle3":
        from .eagle import Eagle3Proposer

        return Eagle3Proposer(head, target.embed_tokens, vocab_size, max_total_tokens)
    if method == "eagle":                           # EAGLE-1: the same drafting, the target's output head
        from .eagle import Eagle3Proposer

        return Eagle3Proposer(head, target.embed_tokens, vocab_size, max_total_tokens,
                              output_head=lambda h: target.compute_logits(h)[:, :head.cfg.vocab_size])
    if method == "medusa":
        from .medusa import MedusaProposer

        return MedusaProposer(head, target.config.num_layers, vocab_size)
    raise ValueError(f"no learned head method '{method}'")
