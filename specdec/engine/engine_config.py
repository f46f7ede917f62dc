"""What `LLMEngine` is built from, handed down whole: the models `LLM` loaded and the engine's settings (vLLM's
engine takes one config object the same way; here the models come loaded, since `LLM` owns loading)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from .scheduler import SchedulerConfig


@dataclass
class EngineConfig:
    model: nn.Module                                  # the target
    tokenizer: object                                 # the target's (and, unless draft_tokenizer, the draft's)
    draft_model: nn.Module | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    max_model_len: int | None = None                  # None: the model's positions
    policy_factory: Callable[[], object] | None = None    # method auto's policy, built on first use
    heads: dict[str, nn.Module] = field(default_factory=dict)   # learned heads by method
    row_cost: Callable[..., float] | None = None      # V(n, context) from the cost model: sizes token trees
    enable_prefix_caching: bool = True
    draft_tokenizer: object | None = None             # a draft with another vocabulary (cross_vocab)

    def __post_init__(self):
        if self.scheduler is None:
            self.scheduler = SchedulerConfig()
        if self.heads is None:
            self.heads = {}
