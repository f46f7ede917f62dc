"""The Python API: `LLM(target=..., draft=..., speculative=SpeculativeConfig(...)).generate(...)`."""
from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from .config import SpeculativeConfig
from .engine import Engine, RequestOutput, StreamDelta
from .models.loader import LoadedModel, load_model
from .models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from .proposers import DraftModelProposer, NgramProposer, check_compatible
from .proposers.base import NoProposer, Proposer
from .sampling_params import SamplingParams

Prompt = str | list[dict]   # raw text or chat messages


class LLM:
    """Loads the target (and draft) once; each `generate` runs requests through the engine.

    >>> llm = LLM(speculative=SpeculativeConfig(method="ngram"))           # doctest: +SKIP
    >>> llm.generate("Write a haiku about caches", SamplingParams(max_tokens=32))[0].text  # doctest: +SKIP
    """

    def __init__(self, target: str = DEFAULT_TARGET, draft: str | None = None,
                 speculative: SpeculativeConfig | None = None, dtype: str = "bfloat16",
                 device: str | None = None, max_model_len: int | None = None, num_threads: int | None = None,
                 progress: bool = True):
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        self.speculative = speculative or SpeculativeConfig(method="draft" if draft else "none")
        self.target: LoadedModel = load_model(target, dtype=dtype, device=device, progress=progress)
        self.tokenizer = self.target.tokenizer
        self.max_model_len = max_model_len
        self.draft: LoadedModel | None = None
        if self.speculative.method == "draft":
            draft = draft or self.speculative.model or DEFAULT_DRAFT
            self.draft = load_model(draft, dtype=dtype, device=device, progress=progress,
                                    quantize=self.speculative.quantization)
            check_compatible(self.tokenizer, self.draft.tokenizer, self.target.config.vocab_size,
                             self.draft.config.vocab_size)
        self.engine = self.make_engine(self.speculative)

    def make_engine(self, spec: SpeculativeConfig) -> Engine:
        """An engine over the loaded models for another speculative config (e.g. the `none` baseline)."""
        proposer: Proposer
        if spec.method == "none":
            proposer = NoProposer()
        elif spec.method == "ngram":
            proposer = NgramProposer(spec.prompt_lookup_max, spec.prompt_lookup_min)
        else:
            if self.draft is None:
                raise ValueError("method 'draft' needs a draft model loaded")
            proposer = DraftModelProposer(self.draft.model, self.tokenizer.vocab_size)
        return Engine(self.target.model, self.tokenizer, proposer, spec.num_speculative_tokens, self.max_model_len)

    def encode(self, prompt: Prompt, chat: bool = True) -> list[int]:
        if isinstance(prompt, list):
            return self.tokenizer.encode_chat(prompt)
        if chat:
            return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt)

    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | None = None, chat: bool = True,
                 engine: Engine | None = None) -> list[RequestOutput]:
        params = params or SamplingParams()
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)):
            prompts = [prompts]
        engine = engine or self.engine
        return [engine.generate(self.encode(p, chat), params) for p in prompts]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, chat: bool = True,
               engine: Engine | None = None) -> Iterator[StreamDelta]:
        return (engine or self.engine).stream(self.encode(prompt, chat), params or SamplingParams())
