"""Engine and speculation configuration (dataclasses; the CLI and HTTP map onto their fields)."""
from __future__ import annotations

from dataclasses import dataclass

METHODS = ("none", "ngram", "draft", "eagle3", "eagle", "medusa", "auto")
QUANTIZATIONS = ("none", "int8", "int4")   # --quantization (target) and the draft's `quantization`
K_MIN, K_MAX = 1, 32                    # num_speculative_tokens (and auto's upper bound) everywhere: CLI, HTTP, policy

# Defaults measured on the 2-core CPU (see README, "Choosing k"): the draft method peaks at k=4,
# n-gram lookup (nearly free to propose) keeps gaining up to k=8 on edit-style prompts.
# For "auto", k is the largest k the policy may choose per request.
DEFAULT_K = {"none": 0, "ngram": 8, "draft": 4, "eagle3": 4, "eagle": 4, "medusa": 3, "auto": 8}
TREE_METHODS = ("eagle3", "eagle", "medusa")       # proposers that can draft a token tree (eagle_topk > 1)


@dataclass
class SpeculativeConfig:
    method: str = "none"                    # none | ngram | draft | auto (policy picks per request)
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
            raise ValueError(f"unknown draft quantization '{self.quantization}' (choose from: {', '.join(QUANTIZATIONS)})")
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


@dataclass
class EngineConfig:
    target: str = "qwen2.5-coder-1.5b-instruct"
    dtype: str = "bfloat16"                 # runtime dtype (float32 for exact parity checks)
    device: str | None = None               # None: cuda if available, else cpu
    max_model_len: int | None = None        # None: the model's context window
    num_threads: int | None = None          # torch CPU threads; None: all cores
