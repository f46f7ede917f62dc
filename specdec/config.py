"""Speculation configuration (a dataclass the CLI and HTTP map onto). It sits above proposers/ because a config
resolves its method's defaults from the method table there."""
from __future__ import annotations

from dataclasses import dataclass

from .proposers.method import AUTO, K_MAX, K_MIN, PLAIN
from .proposers.registry import get_method, tree_methods

__all__ = ["AUTO", "K_MAX", "K_MIN", "PLAIN", "QUANTIZATIONS", "SpeculativeConfig"]

QUANTIZATIONS = ("none", "int8", "int4")   # --quantization (target) and the draft's `quantization`
DRAFT_MLP_BITS = (3, 4)                    # the draft's `draft_mlp_bits` (its int4 MLP linears)
DEFAULT_DRAFT_P_MIN = 0.75                 # llama.cpp's default for --draft-p-min


@dataclass
class SpeculativeConfig:
    method: str = PLAIN                     # a method table name (none, ngram, suffix, draft, ..., auto)
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
    # the draft model's MLP linears (gate/up, down: ~80% of its bytes a step) at 3 bits instead of 4 where its
    # weights are int4: re-quantized with a searched range per group (docs/benchmarks/draft-bits); None = the default
    draft_mlp_bits: int | None = None
    # the draft model's chain stops after a token it gave less than this probability (llama.cpp's --draft-p-min; 0:
    # off): the chain runs on where the draft is sure and stops where it guesses, a draft length chosen per step
    # (docs/benchmarks/draft-confidence). The unsure token itself is verified: its row costs less than it keeps
    draft_p_min: float = DEFAULT_DRAFT_P_MIN

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
        if self.draft_mlp_bits is not None and (isinstance(self.draft_mlp_bits, bool)
                                                or self.draft_mlp_bits not in DRAFT_MLP_BITS):
            raise ValueError(f"draft_mlp_bits must be one of {', '.join(map(str, DRAFT_MLP_BITS))}, "
                             f"got {self.draft_mlp_bits!r}")
        if isinstance(self.draft_p_min, bool) or not isinstance(self.draft_p_min, (int, float)) \
                or not 0.0 <= self.draft_p_min < 1.0:
            raise ValueError(f"draft_p_min must be a probability in [0, 1) (0: off), got {self.draft_p_min!r}")
        self.draft_p_min = float(self.draft_p_min)
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
