"""The engine's proposers: one per method that is loaded, built from the method table (config.METHOD_TABLE) and
what the caller loaded (a draft model, learned heads). The engine holds the dict this returns and looks proposers up
by a sequence's method (or the one its step controller picks); tests put an oracle in the same dict."""
from __future__ import annotations

from torch import nn

from ..config import METHOD_TABLE
from ..models.kv_manager import KVManager
from .base import Proposer
from .draft_model import DraftModelProposer
from .heads import make_head_proposer
from .ngram import NgramProposer
from .suffix import SuffixProposer


def build_proposers(target: nn.Module, vocab_size: int, max_total_tokens: int, max_batched_tokens: int,
                    draft_model: nn.Module | None = None, heads: dict[str, nn.Module] | None = None
                    ) -> dict[str, Proposer]:
    """{method: proposer} for prompt lookup and suffix decoding (always), the draft model (when given) and each
    learned head."""
    proposers: dict[str, Proposer] = {}
    for method in METHOD_TABLE.values():
        if method.kind == "lookup":
            proposers[method.name] = NgramProposer()
        elif method.kind == "cache":
            proposers[method.name] = SuffixProposer()
        elif method.kind == "model" and draft_model is not None:
            proposers[method.name] = DraftModelProposer(draft_model, vocab_size,
                                                        KVManager(draft_model, max_total_tokens), max_batched_tokens)
        elif method.kind == "head" and method.name in (heads or {}):
            proposers[method.name] = make_head_proposer(method.name, heads[method.name], target, vocab_size,
                                                        max_total_tokens)
    return proposers
