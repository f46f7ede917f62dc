"""The method table and the engine's proposers.

`METHOD_TABLE` maps a method's name to its declaration (`method.Method`): plain decoding, the built-in methods
declared beside their proposers, auto, then installed plugins'. It fills itself the first time anything reads it,
so importing a module never registers anything and every reader sees the whole table. `build_proposers` makes
one proposer per declared method whose needs were loaded; the engine holds that dict and looks proposers up by a
sequence's method (tests put an oracle in it)."""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from torch import nn

from . import cross_vocab, draft_model, eagle, hybrid, medusa, ngram, plugins, prediction, suffix
from .base import BuildContext, Proposer
from .method import AUTO, K_MAX, K_MIN, KINDS, NEEDS, PLAIN, Method

METHOD_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# the order every surface lists methods in (after plain decoding, before auto); plugins' come after these
BUILTIN: tuple[Method, ...] = (ngram.METHOD, suffix.METHOD, draft_model.METHOD, cross_vocab.METHOD, hybrid.METHOD,
                               eagle.EAGLE3, eagle.EAGLE, medusa.METHOD, prediction.METHOD)
PLAIN_METHOD = Method(PLAIN, 0, "plain", summary="plain decoding: one target forward per token")
AUTO_METHOD = Method(AUTO, 8, "policy", summary="per request and per step, the method and k the measured cost "
                                                "model expects to pay best; plain where none does (docs/policy.md)")
ROLES = ("step_lookup", "draft_default")     # Method flags one declaration each may hold


class MethodTable(Mapping):
    """name -> Method, in registration order. Filled on first read: plain and auto, the built-in declarations,
    then the `specdec.proposers` entry points (proposers/plugins.py); `register` adds a row at run time."""

    def __init__(self):
        self._rows: dict[str, Method] | None = None

    def _filled(self) -> dict[str, Method]:
        if self._rows is None:
            self._rows = {}                 # set first: a plugin that reads the table while it loads sees the rows
            for m in (PLAIN_METHOD, AUTO_METHOD, *BUILTIN):
                self.register(m)
            plugins.load_plugins(self.register)
        return self._rows

    def __getitem__(self, name: str) -> Method:
        return self._filled()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._filled())

    def __len__(self) -> int:
        return len(self._filled())

    def register(self, method: Method) -> Method:
        """Add a declaration. Raises ValueError naming what is wrong with a bad row (a taken name or role, an
        unknown kind, a k out of range, no proposer factory)."""
        rows = self._filled()
        if not isinstance(method, Method):
            raise ValueError(f"not a specdec.Method: {method!r}")
        if not isinstance(method.name, str) or not METHOD_NAME.match(method.name):
            raise ValueError(f"method name {method.name!r} must match {METHOD_NAME.pattern} (it is a CLI choice, a "
                             "JSON value and a metric label)")
        if method.name in rows:
            raise ValueError(f"method '{method.name}' is already declared (by {rows[method.name].origin})")
        if method.kind not in KINDS:
            raise ValueError(f"method '{method.name}': kind must be one of {', '.join(KINDS)}, got {method.kind!r}")
        if method.needs not in NEEDS:
            raise ValueError(f"method '{method.name}': needs must be one of {NEEDS}, got {method.needs!r}")
        if method.kind != "plain" and not (isinstance(method.default_k, int) and K_MIN <= method.default_k <= K_MAX):
            raise ValueError(f"method '{method.name}': default_k must be in {K_MIN}..{K_MAX}, "
                             f"got {method.default_k!r}")
        if method.kind not in ("plain", "policy") and not callable(method.build):
            raise ValueError(f"method '{method.name}': build must be a callable returning its proposer")
        if method.prior_alpha is not None and not 0 < method.prior_alpha < 1:
            raise ValueError(f"method '{method.name}': prior_alpha must be in (0, 1), got {method.prior_alpha!r}")
        if method.step_lookup and method.kind != "lookup":
            raise ValueError(f"method '{method.name}': step_lookup needs kind 'lookup', got {method.kind!r}")
        if method.draft_default and method.needs != "draft_model":
            raise ValueError(f"method '{method.name}': draft_default needs needs='draft_model'")
        for role in ROLES:
            held = [m.name for m in rows.values() if getattr(m, role)]
            if getattr(method, role) and held:
                raise ValueError(f"method '{method.name}': {role} is already held by '{held[0]}'")
        rows[method.name] = method
        return method

    def unregister(self, name: str) -> None:
        """Take a plugin's method out of the table (tests; the built-ins stay)."""
        rows = self._filled()
        if rows.get(name) is not None and rows[name].origin == "specdec":
            raise ValueError(f"method '{name}' is built in")
        rows.pop(name, None)

    def holder(self, role: str) -> str:
        """The one method whose declaration holds `role` (a flag in ROLES)."""
        try:
            return next(m.name for m in self.values() if getattr(m, role))
        except StopIteration:
            raise ValueError(f"no declared method holds the role {role}") from None


METHOD_TABLE = MethodTable()
register_method = METHOD_TABLE.register
unregister_method = METHOD_TABLE.unregister


def load_plugins() -> dict[str, list[str]]:
    """Register installed plugins' methods that have not been yet: {entry point: [method, ...]}."""
    len(METHOD_TABLE)               # the table's first fill loads them; this call finds any installed since
    return plugins.load_plugins(register_method)


def method_names(*kinds: str) -> tuple[str, ...]:
    """Every declared method (plain first, the policy last), or those of the given kinds."""
    order = {"plain": 0, "policy": 2}
    ms = sorted(METHOD_TABLE.values(), key=lambda m: order.get(m.kind, 1))
    return tuple(m.name for m in ms if not kinds or m.kind in kinds)


def get_method(name: str) -> Method:
    """The declaration of `name`; ValueError listing the declared methods otherwise."""
    try:
        return METHOD_TABLE[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown speculative method '{name}' (choose from: {', '.join(method_names())})") from None


def head_methods() -> tuple[str, ...]:
    return method_names("head")


def tree_methods() -> tuple[str, ...]:
    return tuple(m for m in method_names() if METHOD_TABLE[m].tree)


def draft_model_method() -> str:
    """The method that drafts with a separate draft model (what giving a draft model alone turns on)."""
    return METHOD_TABLE.holder("draft_default")


def lookup_method() -> str:
    """Prompt lookup: the free guess auto's step controller offers beside a model proposer at every step."""
    return METHOD_TABLE.holder("step_lookup")


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
