"""SamplingParams: what a request asks of the sampler, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass, field

from .sampling.grammar import StructuredOutputs

GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    max_tokens: int = 16          # new tokens at most (vLLM's default)
    temperature: float = 1.0      # 0 = greedy (argmax)
    top_p: float = 1.0            # nucleus mass kept, in (0, 1]
    top_k: int = -1               # keep the k most likely tokens; -1 or 0 = off
    min_p: float = 0.0            # drop tokens below min_p * (max probability); 0 = off
    seed: int | None = None       # per-request generator: same seed, same output
    stop: list[str] = field(default_factory=list)  # stop strings (excluded from the text)
    ignore_eos: bool = False
    logprobs: int | None = None   # None: none; 0: each emitted token's logprob; n: and the n most likely (vLLM's)
    structured_outputs: StructuredOutputs | None = None   # a grammar the output must follow (JSON schema, ...)
    # vLLM's names and ranges; applied to every verification row from its own prefix (sampling/penalties.py)
    presence_penalty: float = 0.0     # subtracted once from each token already in the output, in [-2, 2]
    frequency_penalty: float = 0.0    # subtracted per occurrence in the output, in [-2, 2]
    repetition_penalty: float = 1.0   # [0.01, 100]: logits of tokens in prompt or output divided (>0) or multiplied
    logit_bias: dict[int, float] | None = None    # token id -> added to its logit, in [-100, 100]
    min_tokens: int = 0               # no EOS (nor stop string) before this many new tokens
    prompt_logprobs: int | None = None    # vLLM's: each prompt token's logprob (and the n most likely) from the
                                          # prefill's rows; the prompt is then computed whole (no prefix reuse)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or a positive integer, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise ValueError(f"prompt_logprobs must be in [0, 20], got {self.prompt_logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.01 <= self.repetition_penalty <= 100:      # past these, logits / penalty overflow
            raise ValueError(f"repetition_penalty must be in [0.01, 100], got {self.repetition_penalty}")
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {token}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens = {self.max_tokens}], "
                             f"got {self.min_tokens}")

    @property
    def greedy(self) -> bool:
        # vLLM's convention: temperatures below 1e-5 are greedy (dividing logits by them overflows to inf/nan)
        return self.temperature < GREEDY_EPS
