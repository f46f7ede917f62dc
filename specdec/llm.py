"""The Python API: `LLM(target=..., draft=..., speculative=SpeculativeConfig(...)).generate(...)`.

A facade over one `LLMEngine`: it loads the models, owns the speculation policy's cost model (measured once per
machine and cached), and drives the engine's `step()` for the prompts it is given. Several prompts in one
`generate` call are decoded together (continuous batching); method and k are per request.
"""
from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator

import torch

from .config import AUTO, SpeculativeConfig
from .engine import EngineConfig, LLMEngine, RequestOutput, StreamDelta
from .engine_args import EngineArgs
from .errors import SpecDecError
from .loading import LoadedModels, load_models
from .models.heads import LoadedHead
from .models.loader import LoadedModel
from .policy import CostModel, PolicyConfig
from .policy.cost_model import read_cost_file
from .policy.measure import measure_cost_model, measure_quietly
from .policy.pools import SpeculationPolicy
from .proposers.ngram import find_ngram_continuation
from .proposers.registry import METHOD_TABLE, get_method, method_names
from .sampling_params import SamplingParams
from .utils import set_aside

log = logging.getLogger("specdec")

# Part of the cost-model cache key and of the file: 23 = the draft step timed as the mean of a chain of four after the
# target's forwards (a lone first step priced every step of a chain), 22 = CPU tensors from a reusing allocator and the
# tile attention's keys prefetched (a one-token step cheaper, the draft's more), 21 = bf16 attention rows on AMX-BF16
# tiles where the CPU has them (verification rows and prompt reads cheaper), 20 = bf16 attention rows on vdpbf16ps where
# the CPU has AVX-512 BF16 (verification rows cheaper at long context), 19 = verification rows timed with every row's
# logits, ratios taken within each timed round, the draft's step in the target's rounds, 18 = the draft's read timed on
# a 2k prompt too (a long prompt's tokens cost it more each), 17 = AMX from 20 rows, its bf16 rows rounded in the kernel
# (prompt reads and rows of 20+ cheaper), 16 = decode attention sixteen keys at a time, 15 = the int4 layers as one
# compiled call (fused_stack), 14 = a measurement taken on a quiet machine only, 13 = the draft's prompt read timed over
# every token (it was timed over 256 of 512) and its output head cut to the target's tokens, 12 = AVX2 block kernel in
# tiles of 8 rows, 11 = V(n) and c by context buckets (rows attending in blocks), 10 = also at a long context, 9 = heads
# timed after a target forward, as the engine runs them (8: int4 tiles of up to 9 rows, 7: learned heads' costs, 6:
# kernel weights in 2 MB pages, 5: bf16 on specdec._C)
COST_MODEL_REVISION = 23

Prompt = str | list[dict]   # raw text or chat messages


class LLM:
    """Loads the target (and draft) once; `generate` and `stream` run requests through the engine.

    >>> llm = LLM(speculative=SpeculativeConfig(method="ngram"))           # doctest: +SKIP
    >>> llm.generate("Write a haiku about caches", SamplingParams(max_tokens=32))[0].text  # doctest: +SKIP
    """

    def __init__(self, args: EngineArgs | None = None, /, **kwargs):
        """`LLM(EngineArgs(...))`, or `LLM(target=..., draft=..., speculative=..., ...)` with EngineArgs' fields."""
        if args is not None and kwargs:
            raise SpecDecError("give LLM either an EngineArgs or its fields as keyword arguments, not both")
        try:
            self.args = args = args if args is not None else EngineArgs(**kwargs)
        except TypeError as exc:                       # an unknown keyword
            raise SpecDecError(f"LLM: {exc}") from None
        torch.set_num_threads(args.num_threads or os.cpu_count() or 1)
        self.speculative = args.speculative
        self.models: LoadedModels = load_models(args)
        self.quantization = self.models.quantization   # the target's weights: none | int8 | int4 (vLLM's name)
        self.target: LoadedModel = self.models.target
        self.tokenizer = self.target.tokenizer
        self.draft: LoadedModel | None = self.models.draft
        self.draft_quantization: str | None = self.models.draft_quantization
        self.heads: dict[str, LoadedHead] = self.models.heads
        self.scheduler_config = args.scheduler
        self._policy: SpeculationPolicy | None = None
        self._rows: CostModel | None = None
        # token trees are sized by the measured cost of rows (row_cost); without heads nothing asks for it
        self.engine = LLMEngine(EngineConfig(
            self.target.model, self.tokenizer, self.draft.model if self.draft else None, self.scheduler_config,
            args.max_model_len, policy_factory=self.policy, heads={m: h.module for m, h in self.heads.items()},
            row_cost=self.row_cost if self.heads else None, enable_prefix_caching=args.enable_prefix_caching,
            draft_tokenizer=self.draft.tokenizer if self.models.draft_cross_vocab else None))
        self._ids = itertools.count()
        for name, path in self._state_files().items():
            if os.path.exists(path):
                self._load_state(name, path)

    # -- the methods this engine runs ------------------------------------------------------------------------
    def method_names(self) -> tuple[str, ...]:
        """Every method this engine can run (plain, each loaded proposer's, the policy), in the table's order."""
        return tuple(n for n in method_names() if METHOD_TABLE[n].kind in ("plain", "policy") or self.engine.runs(n))

    def methods(self) -> list[dict]:
        """method_names(), each with its declaration's row and its proposer's own status section
        (/v1/speculative/status "methods")."""
        return [{"method": m.name, "kind": m.kind, "default_k": m.default_k, "tree": m.tree, "origin": m.origin,
                 "status": self.method_status(m.name)} for m in map(METHOD_TABLE.get, self.method_names())]

    def method_status(self, name: str) -> dict:
        """One method's status section ({} for one that has none, or is not loaded)."""
        proposer = self.engine.proposers.get(name)
        return proposer.status() if proposer is not None else {}

    def _state_files(self) -> dict[str, str]:
        """{method: path} for each loaded method whose declaration keeps a state file that EngineArgs names."""
        return {m.name: path for m in METHOD_TABLE.values()
                if m.state_file and m.name in self.engine.proposers and (path := getattr(self.args, m.state_file))}

    def _load_state(self, name: str, path: str) -> None:
        """A method's state file, read whole; one that cannot be read is set aside (`<path>.damaged`) with one
        warning line and the method starts empty: what it held was only ever a cache."""
        try:
            self.engine.proposers[name].load(path)
        except SpecDecError as exc:
            aside = set_aside(path)
            log.warning("%s; set aside as %s, starting with an empty %s state", exc, aside, name)

    def save_state(self) -> None:
        """Write each method's state file (suffix decoding's pools to --suffix-cache), atomically."""
        for name, path in self._state_files().items():
            self.engine.proposers[name].save(path)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    # -- method auto: the policy picks a method and k per request and per step ----------------------------
    @property
    def policy_created(self) -> bool:
        return self._policy is not None

    def policy_status(self) -> dict | None:
        """The policy's cost model and pools, or None when no request has used method auto yet."""
        return self._policy.status() if self._policy is not None else None

    def policy(self, cfg: PolicyConfig | None = None, cost: CostModel | None = None,
               available: tuple[str, ...] | None = None) -> SpeculationPolicy:
        """The speculation policy (created on first use; its cost model is measured once per machine and cached)."""
        if self._policy is None:
            cfg = cfg or self.args.policy_config
            available = available or self.policy_candidates()
            # a head is weighed only for prompts within the context it was trained at
            limits = {m: h.trained_context for m, h in self.heads.items() if h.trained_context}
            # the free proposers whose matches each step weighs beside a model: they need no request of their own
            matched = tuple(m for m in available if m in self.engine.proposers and self.engine.proposers[m].matches)
            self._policy = SpeculationPolicy(cost or self.cost_model(cfg.k_max), cfg, available, max_context=limits,
                                             matched=matched)
        return self._policy

    def policy_candidates(self) -> tuple[str, ...]:
        """What auto weighs: every loaded proposer's method, prompt lookup first, then the models, the heads and
        the caches (the order it explores an unobserved pool in)."""
        order = {"lookup": 0, "model": 1, "head": 2, "cache": 3}
        return tuple(sorted((m for m in self.engine.proposers if get_method(m).auto_candidate),
                            key=lambda m: order.get(get_method(m).kind, 4)))

    def row_cost(self, n: int, context: int = 0) -> float:
        """V(n) after `context` tokens: a target forward over n rows relative to one, from the cost model (measured
        once per machine and cached; the policy's when it has one)."""
        if self._policy is not None:
            return self._policy.cost.at(context).V(n)     # as the policy's clock re-prices it
        if self._rows is None:
            self._rows = self.cost_model(get_method(AUTO).default_k)
        return self._rows.at(context).V(n)

    def cost_model(self, k_max: int) -> CostModel:
        import hashlib

        from .models.registry import cache_dir
        from .utils import write_json_atomic

        # the revision changes when the forward's cost changes shape (e.g. the fused CPU ops), so that a cost model
        # measured on older code is measured again
        p = self.target.model.embed_tokens.weight
        max_rows = self.scheduler_config.max_num_seqs * (k_max + 1)
        key = "|".join(map(str, (self.target.source, self.draft.source if self.draft else None, p.dtype, p.device,
                                 torch.get_num_threads(), k_max, max_rows, torch.__version__,
                                 self.speculative.prompt_lookup_max, self.speculative.prompt_lookup_min,
                                 self.quantization, self.draft_quantization, self.models.draft_vocab_size,
                                 self.models.draft_mlp_bits,
                                 COST_MODEL_REVISION,
                                 sorted((m, str(h.source), h.quantization) for m, h in self.heads.items()))))
        path = cache_dir() / "cost_models" / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")
        saved = read_cost_file(path, key, COST_MODEL_REVISION)   # None: none, unreadable or another version's
        if saved is not None:
            return saved
        cost, clean = measure_quietly(lambda: measure_cost_model(
            self.target.model, self.draft.model if self.draft else None,
            lambda ids: find_ngram_continuation(ids, k_max, self.speculative.prompt_lookup_max,
                                                self.speculative.prompt_lookup_min), k_max,
            max_rows=max_rows, heads={m: self.engine.proposers[m] for m in self.heads}))
        if clean:
            write_json_atomic(path, {**cost.to_dict(), "key": key, "revision": COST_MODEL_REVISION})
        else:       # kept for this run only: the next start measures again
            log.warning("the cost model was measured while other processes kept this machine busy; it is not "
                        "cached and will be measured again at the next start")
        return cost

    # -- generation -------------------------------------------------------------------------------------------
    def encode(self, prompt: Prompt, chat: bool = True) -> list[int]:
        if isinstance(prompt, list):
            return self.tokenizer.encode_chat(prompt)
        if chat:
            return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        return self.tokenizer.encode(prompt)

    def _spec(self, spec: SpeculativeConfig | str | None) -> SpeculativeConfig:
        if spec is None:
            return self.speculative
        return SpeculativeConfig(method=spec) if isinstance(spec, str) else spec

    def generate(self, prompts: Prompt | list[Prompt] | list[int], params: SamplingParams | None = None,
                 chat: bool = True, spec: SpeculativeConfig | str | None = None, pool: str = "default",
                 request_id: str | None = None, cache_salt: str | None = None) -> list[RequestOutput]:
        """Run prompts (text, chat messages, or one list of token ids) to completion, batched together. cache_salt:
        reuse cached prefixes (and suffix-pool outputs) only of requests with the same salt (vLLM's field)."""
        params = params or SamplingParams()
        if isinstance(prompts, list) and prompts and isinstance(prompts[0], int):
            batch = [list(prompts)]
        elif isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)):
            batch = [self.encode(prompts, chat)]
        else:
            batch = [self.encode(p, chat) for p in prompts]
        spec = self._spec(spec)
        ids = [request_id if request_id and len(batch) == 1 else f"llm-{next(self._ids)}" for _ in batch]
        seqs = [self.engine.add_request(rid, p, params, spec, pool, cache_salt) for rid, p in zip(ids, batch)]
        try:
            pending = set(ids)
            while pending:
                for out in self.engine.step():
                    if out.error is not None and out.request_id in pending:
                        raise out.error
                    if out.delta is not None and out.delta.finished:
                        pending.discard(out.request_id)
        finally:
            for rid in ids:
                self.engine.abort(rid)               # no-op for finished requests; frees the rest on error
        return [RequestOutput(s.prompt_ids, list(s.output_ids), s.text, s.finish_reason, s.stats, s.logprobs,
                              s.prompt_logprobs)
                for s in seqs]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, chat: bool = True,
               spec: SpeculativeConfig | str | None = None) -> Iterator[StreamDelta]:
        """One request's deltas as the engine steps (other requests added meanwhile share the steps)."""
        rid = f"llm-{next(self._ids)}"
        self.engine.add_request(rid, self.encode(prompt, chat), params or SamplingParams(), self._spec(spec))
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id != rid:
                        continue
                    if out.error is not None:
                        raise out.error
                    yield out.delta
                    if out.delta.finished:
                        return
                if not self.engine.has_unfinished():
                    raise SpecDecError(f"request {rid} vanished from the engine")
        finally:
            self.engine.abort(rid)
