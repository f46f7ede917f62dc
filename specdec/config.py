"""Engine and speculation configuration (dataclasses; the CLI and HTTP map onto their fields)."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

QUANTIZATIONS = ("none", "int8", "int4")   # --quantization (target) and the draft's `quantization`
K_MIN, K_MAX = 1, 32                    # num_speculative_tokens (and auto's upper bound) everywhere: CLI, HTTP, policy


PLAIN = "none"                          # the method without a proposer: plain decoding
AUTO = "auto"                           # the method that picks among the others per request and per step
KINDS = ("plain", "lookup", "cache", "model", "head", "policy")
NEEDS = ("", "draft_model", "head")      # what a method needs loaded beside the target


@dataclass(frozen=True)
class Method:
    """One speculative method, declared once beside its proposer (proposers/<file>.py) and registered into
    METHOD_TABLE. Every surface reads the table: the request schema, the CLI's choices, auto's candidates,
    `bench offline --methods`, /v1/speculative/status and the README's method table (tools/method_table.py). The
    engine never tests a method's name; it asks this table, and holds one proposer per loaded method.

    A third-party package declares one the same way and names it in the `specdec.proposers` entry-point group
    (proposers/plugins.py)."""
    name: str
    default_k: int                      # measured on the 2-core CPU (docs/tuning.md, "Choosing k")
    kind: str                           # plain: no proposer | lookup: proposes from the sequence itself, free of
                                        # forwards | cache: from what the request's pool generated before and the
                                        # sequence itself, free of forwards | model: a draft model's step per token
                                        # | head: a learned head reading the target's hidden states | policy: picks
                                        # among the others
    prior_alpha: float | None = None    # the policy's acceptance before any observation (greedy); with the kind,
                                        # auto's cost terms (policy/cost_model.py: draft_cost)
    tree: bool = False                  # can draft a token tree (eagle_topk > 1)
    trainable: bool = False             # `specdec train-head --method` trains it
    needs: str = ""                     # what must be loaded for it: "" | "draft_model" | "head"
    build: Callable[[Any], Any] | None = None   # the proposer factory: build(proposers.base.BuildContext) ->
                                        # Proposer, or None when what it needs is not loaded
    state_file: str | None = None       # the EngineArgs field naming the file its proposer's state is read from at
                                        # start and saved to as it grows (suffix decoding's pools)
    summary: str = ""                   # one line for the README's method table and --help
    auto_candidate: bool = True         # method auto may pick it (False: it drafts from what a request brings, a
                                        # prediction, so only that request can choose it)
    origin: str = "specdec"             # the package that declared it (a plugin's distribution)
    # a method without a proposer of its own that drafts through the step controller: combines[0] a model
    # proposer, the rest free ones (lookup, cache) whose longest match each step weighs against the model
    combines: tuple[str, ...] = ()
    # roles one method each holds, named here rather than implied by the order methods were registered in:
    step_lookup: bool = False           # the free guess auto's step controller offers beside a model proposer
    draft_default: bool = False         # what giving a draft model alone turns on

    @property
    def drafts_with_model(self) -> bool:
        """Pays a forward per draft token (a draft model or a head), unlike prompt lookup."""
        return self.kind in ("model", "head")

    @property
    def free(self) -> bool:
        """Proposes by searching token arrays, without a forward (priced like prompt lookup)."""
        return self.kind in ("lookup", "cache")

    @property
    def needs_text(self) -> str:
        return {"draft_model": "a draft model; none is loaded", "head": "its head loaded at start-up"}.get(
            self.needs, "nothing")


METHOD_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# method name -> declaration, in registration order: plain and auto here, the built-in proposers' as
# specdec.proposers is imported, plugins' at `import specdec` (proposers/plugins.py)
METHOD_TABLE: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add a declaration to the method table. Raises ValueError naming what is wrong with a bad row (a taken
    name, an unknown kind, a k out of range, no proposer factory)."""
    if not isinstance(method, Method):
        raise ValueError(f"not a specdec.config.Method: {method!r}")
    if not isinstance(method.name, str) or not METHOD_NAME.match(method.name):
        raise ValueError(f"method name {method.name!r} must match {METHOD_NAME.pattern} (it is a CLI choice, a JSON "
                         "value and a metric label)")
    if method.name in METHOD_TABLE:
        raise ValueError(f"method '{method.name}' is already declared (by {METHOD_TABLE[method.name].origin})")
    if method.kind not in KINDS:
        raise ValueError(f"method '{method.name}': kind must be one of {', '.join(KINDS)}, got {method.kind!r}")
    if method.needs not in NEEDS:
        raise ValueError(f"method '{method.name}': needs must be one of {NEEDS}, got {method.needs!r}")
    if method.kind != "plain" and not (isinstance(method.default_k, int) and K_MIN <= method.default_k <= K_MAX):
        raise ValueError(f"method '{method.name}': default_k must be in {K_MIN}..{K_MAX}, got {method.default_k!r}")
    if method.kind not in ("plain", "policy") and not callable(method.build):
        raise ValueError(f"method '{method.name}': build must be a callable returning its proposer")
    if method.prior_alpha is not None and not 0 < method.prior_alpha < 1:
        raise ValueError(f"method '{method.name}': prior_alpha must be in (0, 1), got {method.prior_alpha!r}")
    if method.step_lookup and method.kind != "lookup":
        raise ValueError(f"method '{method.name}': step_lookup needs kind 'lookup', got {method.kind!r}")
    if method.draft_default and method.needs != "draft_model":
        raise ValueError(f"method '{method.name}': draft_default needs needs='draft_model'")
    for role in ("step_lookup", "draft_default"):
        held = [m.name for m in METHOD_TABLE.values() if getattr(m, role)]
        if getattr(method, role) and held:
            raise ValueError(f"method '{method.name}': {role} is already held by '{held[0]}'")
    METHOD_TABLE[method.name] = method
    return method


def unregister_method(name: str) -> None:
    """Take a plugin's method out of the table (tests; the built-ins stay)."""
    if METHOD_TABLE.get(name) is not None and METHOD_TABLE[name].origin == "specdec":
        raise ValueError(f"method '{name}' is built in")
    METHOD_TABLE.pop(name, None)


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
    return _holder("draft_default")


def lookup_method() -> str:
    """Prompt lookup: the free guess auto's step controller offers beside a model proposer at every step."""
    return _holder("step_lookup")


def _holder(role: str) -> str:
    try:
        return next(m.name for m in METHOD_TABLE.values() if getattr(m, role))
    except StopIteration:
        raise ValueError(f"no declared method holds the role {role} (specdec.proposers declares one)") from None


register_method(Method(PLAIN, 0, "plain", summary="plain decoding: one target forward per token"))
register_method(Method(AUTO, 8, "policy", summary="per request and per step, the method and k the measured cost "
                                                  "model expects to pay best; plain where none does (docs/policy.md)"))


@dataclass
class SpeculativeConfig:
    method: str = PLAIN                     # a METHOD_TABLE name (none, ngram, suffix, draft, ..., auto)
    num_speculative_tokens: int | None = None   # k; None = the method's default
    model: str | None = None                # draft model (method "draft") or head directory (eagle3, medusa);
                                            # None = the default draft / the head shipped for the default target
    prompt_lookup_max: int = 4              # n-gram: longest tail n-gram tried first
    prompt_lookup_min: int = 1              # n-gram: shortest n-gram accepted
    quantization: str | None = None         # draft model weights: "none" (runtime dtype), "int8" or "int4" (CPU);
                                            # None = the default: int4 for a bf16 draft on CPU with specdec._C built
    # token trees (learned heads, greedy requests; SGLang's --speculative-eagle-topk / --speculative-num-steps):
    # with eagle_topk > 1 the head expands its eagle_topk best guesses per node, num_steps deep, and the target
    # verifies the num_speculative_tokens likeliest nodes of that tree in one forward (EAGLE-2). Sampled and
    # grammar-constrained requests verify a chain. eagle_topk 1: a chain of num_speculative_tokens.
    eagle_topk: int = 1
    num_steps: int | None = None            # tree depth; None: num_speculative_tokens for a chain, else at most 4
    # OpenAI's Predicted Outputs: the tokens the client expects back (the file being edited), a request's own draft
    # source for the method that reads them (proposers/prediction.py)
    prediction: list[int] | None = None
    # the draft model's output head cut to the N tokens its target emits most (proposers/draft_vocab.py; read at
    # load): None = the default where a ranking ships for the target, 0 = the whole head
    draft_vocab_size: int | None = None

    def __post_init__(self):
        method = get_method(self.method)
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = method.default_k
        if method.kind == "plain":
            self.num_speculative_tokens = 0
        elif not K_MIN <= self.num_speculative_tokens <= K_MAX:
            raise ValueError(f"num_speculative_tokens must be in {K_MIN}..{K_MAX}, got {self.num_speculative_tokens}")
        if self.quantization == "":
            self.quantization = None
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"unknown draft quantization '{self.quantization}' "
                             f"(choose from: {', '.join(QUANTIZATIONS)})")
        if self.draft_vocab_size is not None and (isinstance(self.draft_vocab_size, bool)
                                                  or not isinstance(self.draft_vocab_size, int)
                                                  or self.draft_vocab_size < 0):
            raise ValueError(f"draft_vocab_size must be a whole number >= 0 (0: the whole head), "
                             f"got {self.draft_vocab_size!r}")
        if not 1 <= self.eagle_topk <= 16:
            raise ValueError(f"eagle_topk must be in 1..16, got {self.eagle_topk}")
        if self.eagle_topk > 1 and not method.tree:
            raise ValueError(f"eagle_topk > 1 (a token tree) needs a method that drafts trees: "
                             f"{' or '.join(tree_methods())}, not '{self.method}'")
        if self.num_steps is None:
            k = self.num_speculative_tokens
            self.num_steps = k if self.eagle_topk == 1 else min(k, 4)
        if self.num_speculative_tokens and not 1 <= self.num_steps <= self.num_speculative_tokens:
            raise ValueError(f"num_steps (the tree's depth) must be in 1..num_speculative_tokens "
                             f"({self.num_speculative_tokens}), got {self.num_steps}")
        if self.eagle_topk == 1 and self.num_steps != self.num_speculative_tokens and method.kind != "plain":
            raise ValueError("num_steps differs from num_speculative_tokens only for a tree (eagle_topk > 1)")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{self.prompt_lookup_min}, {self.prompt_lookup_max}")
