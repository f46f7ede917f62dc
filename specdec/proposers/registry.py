"""The built-in methods' declarations, registered into config.METHOD_TABLE, and the engine's proposers: one per
declared method whose needs are loaded, built by the method's own `build`. The engine holds the dict
`build_proposers` returns and looks proposers up by a sequence's method (or the one its step controller picks);
tests put an oracle in the same dict."""
from __future__ import annotations

from torch import nn

from ..config import METHOD_TABLE, Method, get_method, register_method
from . import cross_vocab, draft_model, eagle, hybrid, medusa, ngram, prediction, suffix
from .base import BuildContext, Proposer

# registration order is the order every surface lists them in (after plain decoding, before auto)
BUILTIN: tuple[Method, ...] = (ngram.METHOD, suffix.METHOD, draft_model.METHOD, cross_vocab.METHOD, hybrid.METHOD,
                               eagle.EAGLE3, eagle.EAGLE, medusa.METHOD, prediction.METHOD)
for _m in BUILTIN:
    if _m.name not in METHOD_TABLE:         # a module reload (tests) finds them registered
        register_method(_m)


def build_proposers(target: nn.Module, vocab_size: int, max_total_tokens: int, max_batched_tokens: int,
                    draft_model: nn.Module | None = None, heads: dict[str, nn.Module] | None = None,
                    target_tokenizer=None, draft_tokenizer=None) -> dict[str, Proposer]:
    """{method: proposer} for every declared method its `build` can make from what was loaded (prompt lookup,
    suffix decoding and free plugins always; the draft model's and each head's when loaded; a draft_tokenizer
    means the draft has another vocabulary: cross_vocab drafts with it, draft does not)."""
    ctx = BuildContext(target, vocab_size, max_total_tokens, max_batched_tokens, draft_model, heads or {},
                       target_tokenizer, draft_tokenizer)
    proposers: dict[str, Proposer] = {}
    for method in METHOD_TABLE.values():
        if method.build is None:
            continue
        proposer = method.build(ctx)
        if proposer is not None:
            proposer.name = method.name         # EAGLE-1 runs EAGLE-3's class; prefix entries key caches by name
            proposers[method.name] = proposer
    return proposers


def build_proposer(method: str, ctx: BuildContext) -> Proposer | None:
    """One method's proposer from `ctx` (benchmarks that time a head outside an engine)."""
    proposer = get_method(method).build(ctx)
    if proposer is not None:
        proposer.name = method
    return proposer
