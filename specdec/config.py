"""Engine and speculation configuration (dataclasses; the CLI and HTTP map onto their fields)."""
from __future__ import annotations

from dataclasses import dataclass

QUANTIZATIONS = ("none", "int8", "int4")   # --quantization (target) and the draft's `quantization`
K_MIN, K_MAX = 1, 32                    # num_speculative_tokens (and auto's upper bound) everywhere: CLI, HTTP, policy


@dataclass(frozen=True)
class Method:
    """One speculative method: what proposes its tokens and how the policy prices it. The engine never tests a
    method's name; it asks this table, and holds one proposer per loaded method (proposers/registry.py)."""
    name: str
    default_k: int                      # measured on the 2-core CPU (docs/tuning.md, "Choosing k")
    kind: str                           # plain: no proposer | lookup: proposes from the sequence itself, free of
                                        # forwards | cache: from what the request's pool generated before and the
                                        # sequence itself, free of forwards | model: a draft model's step per token
                                        # | head: a learned head reading the target's hidden states | policy: picks
                                        # among the others
    prior_alpha: float | None = None    # the policy's acceptance before any observation (greedy)
    tree: bool = False                  # can draft a token tree (eagle_topk > 1)
    trainable: bool = False             # `specdec train-head --method` trains it
    needs: str = ""                     # what must be loaded for it, said when it is not

    @property
    def drafts_with_model(self) -> bool:
        """Pays a forward per draft token (a draft model or a head), unlike prompt lookup."""
        return self.kind in ("model", "head")


# Defaults measured on the 2-core CPU: the draft model peaks at k=4, n-gram lookup (nearly free to propose) keeps
# gaining up to k=8 on edit-style prompts; for "auto", k is the largest k the policy may choose per request.
METHOD_TABLE: dict[str, Method] = {m.name: m for m in (
    Method("none", 0, "plain"),
    Method("ngram", 8, "lookup", prior_alpha=0.3),
    Method("suffix", 8, "cache", prior_alpha=0.3),
    Method("draft", 4, "model", prior_alpha=0.8, needs="a draft model; none is loaded"),
    Method("eagle3", 4, "head", prior_alpha=0.5, tree=True, trainable=True, needs="its head loaded at start-up"),
    Method("eagle", 4, "head", prior_alpha=0.5, tree=True, needs="its head loaded at start-up"),
    Method("medusa", 3, "head", prior_alpha=0.4, tree=True, trainable=True, needs="its head loaded at start-up"),
    Method("auto", 8, "policy"),
)}
METHODS = tuple(METHOD_TABLE)
DEFAULT_K = {m.name: m.default_k for m in METHOD_TABLE.values()}
TREE_METHODS = tuple(m.name for m in METHOD_TABLE.values() if m.tree)
HEAD_METHODS = tuple(m.name for m in METHOD_TABLE.values() if m.kind == "head")
MODEL_METHODS = tuple(m.name for m in METHOD_TABLE.values() if m.drafts_with_model)


@dataclass
class SpeculativeConfig:
    method: str = "none"                    # none | ngram | suffix | draft | eagle3 | eagle | medusa | auto
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

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown speculative method '{self.method}' (choose from: {', '.join(METHODS)})")
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = DEFAULT_K[self.method]
        if self.method == "none":
            self.num_speculative_tokens = 0
        elif not K_MIN <= self.num_speculative_tokens <= K_MAX:
            raise ValueError(f"num_speculative_tokens must be in {K_MIN}..{K_MAX}, got {self.num_speculative_tokens}")
        if self.quantization == "":
            self.quantization = None
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"unknown draft quantization '{self.quantization}' "
                             f"(choose from: {', '.join(QUANTIZATIONS)})")
        if not 1 <= self.eagle_topk <= 16:
            raise ValueError(f"eagle_topk must be in 1..16, got {self.eagle_topk}")
        if self.eagle_topk > 1 and self.method not in TREE_METHODS:
            raise ValueError(f"eagle_topk > 1 (a token tree) needs a learned head: method "
                             f"{' or '.join(TREE_METHODS)}, not '{self.method}'")
        if self.num_steps is None:
            k = self.num_speculative_tokens
            self.num_steps = k if self.eagle_topk == 1 else min(k, 4)
        if self.num_speculative_tokens and not 1 <= self.num_steps <= self.num_speculative_tokens:
            raise ValueError(f"num_steps (the tree's depth) must be in 1..num_speculative_tokens "
                             f"({self.num_speculative_tokens}), got {self.num_steps}")
        if self.eagle_topk == 1 and self.num_steps != self.num_speculative_tokens and self.method != "none":
            raise ValueError("num_steps differs from num_speculative_tokens only for a tree (eagle_topk > 1)")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{self.prompt_lookup_min}, {self.prompt_lookup_max}")
