"""The Python API: `LLM(target=..., draft=..., speculative=SpeculativeConfig(...)).generate(...)`."""
from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from .config import DEFAULT_K, SpeculativeConfig
from .engine import Engine, RequestOutput, StreamDelta
from .models.loader import LoadedModel, load_model
from .models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from .engine.sequence import Sequence
from .policy import CostModel, Decision, PolicyConfig, RequestFeatures
from .policy.measure import measure_cost_model
from .policy.pools import SpeculationPolicy
from .proposers import DraftModelProposer, NgramProposer, check_compatible
from .proposers.ngram import find_ngram_continuation
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
        if self.speculative.method in ("draft", "auto") and draft != "none":
            draft = draft or self.speculative.model or DEFAULT_DRAFT
            self.draft = load_model(draft, dtype=dtype, device=device, progress=progress,
                                    quantize=self.speculative.quantization)
            check_compatible(self.tokenizer, self.draft.tokenizer, self.target.config.vocab_size,
                             self.draft.config.vocab_size)
        self._policy: SpeculationPolicy | None = None
        self._auto_engines: dict[str, Engine] = {}
        self.engine = self.make_engine(self.speculative)

    # -- method "auto": the policy picks none / ngram / draft and k per request ------------------------------
    def policy(self, cfg: PolicyConfig | None = None, cost: CostModel | None = None) -> SpeculationPolicy:
        """The speculation policy (created on first use; its cost model is measured once per machine and cached)."""
        if self._policy is None:
            cfg = cfg or PolicyConfig(k_max=self.speculative.num_speculative_tokens
                                      if self.speculative.method == "auto" else DEFAULT_K["auto"])
            available = ("ngram", "draft") if self.draft is not None else ("ngram",)
            self._policy = SpeculationPolicy(cost or self.cost_model(cfg.k_max), cfg, available)
        return self._policy

    def cost_model(self, k_max: int) -> CostModel:
        import hashlib
        import json

        from .models.registry import cache_dir
        from .utils import write_json_atomic

        p = self.target.model.embed_tokens.weight
        key = "|".join(map(str, (self.target.source, self.draft.source if self.draft else None, p.dtype, p.device,
                                 torch.get_num_threads(), k_max, torch.__version__, self.speculative.quantization)))
        path = cache_dir() / "cost_models" / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")
        if path.is_file():
            try:
                return CostModel.from_dict(json.loads(path.read_text()))
            except (ValueError, KeyError):
                pass                                 # unreadable: measure again
        cost = measure_cost_model(self.target.model, self.draft.model if self.draft else None,
                                  lambda ids: find_ngram_continuation(ids, k_max, self.speculative.prompt_lookup_max,
                                                                      self.speculative.prompt_lookup_min), k_max)
        write_json_atomic(path, {**cost.to_dict(), "key": key})
        return cost

    def auto_sequence(self, prompt_ids: list[int], params: SamplingParams, request_id: str, pool: str = "default",
                      load: int = 0) -> tuple[Engine, Sequence, Decision]:
        """Decide for one request; returns the engine to run it on and its sequence (k controller attached)."""
        policy = self.policy()
        d = policy.decide(request_id, pool, RequestFeatures(params.temperature, params.top_p, params.max_tokens, load))
        key = "none" if d.method == "none" else "spec"
        if key not in self._auto_engines:
            if key == "none":
                engine = self.make_engine(SpeculativeConfig("none"))
            else:   # the draft (when loaded) and prompt lookup side by side; the step controller picks per step
                proposer = (DraftModelProposer(self.draft.model, self.tokenizer.vocab_size) if self.draft is not None
                            else NoProposer())
                engine = Engine(self.target.model, self.tokenizer, proposer, policy.cfg.k_max, self.max_model_len,
                                lookup=NgramProposer(self.speculative.prompt_lookup_max,
                                                     self.speculative.prompt_lookup_min))
            self._auto_engines[key] = engine
        engine = self._auto_engines[key]
        seq = engine.new_sequence(prompt_ids, params)
        seq.controller = policy.controller(d, pool, params.temperature)
        seq.stats.method, seq.stats.num_speculative_tokens, seq.stats.policy_reason = d.method, d.k, d.reason
        return engine, seq, d

    def generate_auto(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
                      pool: str = "default") -> RequestOutput:
        engine, seq, d = self.auto_sequence(prompt_ids, params, request_id, pool)
        for _ in engine.run(seq):
            pass
        self.policy().record(pool, d, params.temperature, seq.stats, seq.controller)
        return RequestOutput(seq.prompt_ids, list(seq.output_ids), seq.text, seq.finish_reason, seq.stats)

    def make_engine(self, spec: SpeculativeConfig) -> Engine:
        """An engine over the loaded models for another speculative config (e.g. the `none` baseline)."""
        proposer: Proposer
        if spec.method == "auto":
            return _AutoEngine(self)
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


class _AutoEngine:
    """What `make_engine(SpeculativeConfig("auto"))` returns: the Engine interface, with the policy choosing the
    real engine, method and k per request (pool "default")."""
    method = "auto"

    def __init__(self, llm: LLM):
        self.llm = llm
        self._n = 0
        self.max_model_len = llm.make_engine(SpeculativeConfig("none")).max_model_len

    def generate(self, prompt_ids: list[int], params: SamplingParams, pool: str = "default",
                 request_id: str | None = None) -> RequestOutput:
        self._n += 1
        return self.llm.generate_auto(prompt_ids, params, request_id or f"auto-{self._n}", pool)

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[StreamDelta]:
        self._n += 1
        engine, seq, d = self.llm.auto_sequence(prompt_ids, params, f"auto-{self._n}")
        for delta in engine.run(seq):
            if delta.finished:
                self.llm.policy().record("default", d, params.temperature, seq.stats, seq.controller)
            yield delta
