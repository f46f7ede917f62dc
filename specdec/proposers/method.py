"""A speculative method's declaration (`Method`) and the names every layer above shares. Plain data: the proposer
modules declare their methods with it, and proposers/registry.py keeps the table of them."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

K_MIN, K_MAX = 1, 32                    # num_speculative_tokens (and auto's upper bound) everywhere: CLI, HTTP, policy
PLAIN = "none"                          # the method without a proposer: plain decoding
AUTO = "auto"                           # the method that picks among the others per request and per step
KINDS = ("plain", "lookup", "cache", "model", "head", "policy")
NEEDS = ("", "draft_model", "head")      # what a method needs loaded beside the target


@dataclass(frozen=True)
class Method:
    """One speculative method, declared once beside its proposer (proposers/<file>.py); the method table
    (proposers/registry.py) holds every declaration. Every surface reads the table: the request schema, the CLI's
    choices, auto's candidates, `bench offline --methods`, /v1/speculative/status and the README's method table
    (tools/method_table.py). The engine never tests a method's name; it asks this table, and holds one proposer
    per loaded method.

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
