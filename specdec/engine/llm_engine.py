"""The engine core: `add_request`, `abort`, `step()`. Every caller (the CLI, `LLM`, the benchmarks, the server)
drives this one object.

One step, one object per stage:
1. schedule (`Scheduler`, scheduler.py): which sequences decode, which prompt chunks run;
2. propose (`Drafting`, drafting.py, over `self.proposers`, one per loaded method): each decoding sequence's draft
   from its method's proposer (auto's and hybrid's: the step-choice proposer, which drafts through whatever the
   request's step controller picks); each proposer drafts for all its sequences at once;
3. execute (`ModelRunner`, model_runner.py): one target forward over every row of every sequence;
4. verify (`verify_step`, sampling/verifier.py): greedy and sampled sequences, chains and trees, grammar masks;
5. commit (`Committer`, commit.py): cache truncation, stop conditions, stats, the proposers told what happened; a
   finished request's caches become a prefix entry here, and the policy hears its outcome.
A sequence's greedy output does not depend on what else is in the step: every row is computed the same way whatever
the batch (see models/packed_linear.py and models/attn_metadata.py).
"""
from __future__ import annotations

import threading
import time

import torch

from ..config import SpeculativeConfig
from ..errors import SpecDecError
from ..models.kv_manager import KVManager
from ..models.prefix_cache import PrefixCache, salt_key
from ..proposers.base import Proposer, empty_draft
from ..proposers.registry import build_proposers, get_method
from ..sampling.logprobs import token_logprobs
from ..sampling.penalties import Penalties, wants_penalties
from ..sampling.verifier import Verification, verify_step
from ..sampling_params import SamplingParams
from .commit import Committer, StepTimes
from .drafting import Drafting
from .engine_config import EngineConfig
from .model_runner import ModelRunner
from .output import StepInfo, StepOutput, StreamDelta
from .scheduler import Scheduler
from .sequence import Sequence, SpecState


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = c = config
        model, tokenizer = c.model, c.tokenizer
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size         # shared with the draft; padding rows never sampled
        self.max_model_len = min(c.max_model_len or model.config.max_position_embeddings,
                                 model.config.max_position_embeddings)
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.device = model.embed_tokens.weight.device
        self.sched_cfg = c.scheduler
        # finished requests' K/V stays, matched by token prefix, in the same budget (models/prefix_cache.py)
        self.kv = KVManager(model, self.sched_cfg.max_total_tokens,
                            PrefixCache() if c.enable_prefix_caching else None)
        self.runner = ModelRunner(model, self.kv)
        self.scheduler = Scheduler(self.sched_cfg, self.kv, self.runner.exact_rows)
        # one proposer per loaded method ({method: Proposer}); learned heads ({method: nn.Module} given) read the
        # target's hidden states from the step's own forward; draft_tokenizer: a draft with another vocabulary
        self.proposers: dict[str, Proposer] = build_proposers(model, self.vocab_size, self.sched_cfg.max_total_tokens,
                                                              self.sched_cfg.max_num_batched_tokens, c.draft_model,
                                                              c.heads, tokenizer, c.draft_tokenizer)
        self.drafting = Drafting(self.proposers, c.policy_factory, c.row_cost)
        self.committer = Committer(self.kv, self.vocab_size, self.drafting.uses, self.drafting.reader)
        self.seqs: dict[str, Sequence] = {}
        self.last_step = StepInfo()
        self._stepping = threading.Lock()

    # -- requests ---------------------------------------------------------------------------------------------
    @property
    def policy(self):
        """The speculation policy of method auto (built on first use)."""
        return self.drafting.policy

    @property
    def row_cost(self):
        return self.drafting.row_cost

    def runs(self, name: str) -> bool:
        return self.drafting.runs(name)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    spec: SpeculativeConfig | None = None, pool: str = "default",
                    cache_salt: str | None = None) -> Sequence:
        """Queue a request; it joins the running batch at a step boundary. Raises SpecDecError for bad input.
        cache_salt (vLLM's field): the request reuses prefix-cache entries and suffix-pool outputs only of requests
        with the same salt (None: the shared partition)."""
        spec = spec or SpeculativeConfig()
        if request_id in self.seqs:
            raise SpecDecError(f"request id '{request_id}' is already running")
        if not prompt_ids:
            raise SpecDecError("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise SpecDecError(f"the prompt is {len(prompt_ids)} tokens; the context window is {self.max_model_len} "
                               "tokens (the prompt and at least one new token must fit)")
        method = get_method(spec.method)
        if method.kind not in ("plain", "policy") and not self.runs(spec.method):
            alike = [m for m in self.proposers if get_method(m).kind == method.kind]
            raise SpecDecError(f"speculative method '{spec.method}' needs {method.needs_text}"
                               + (f" (the server's --speculative-config method); loaded: {', '.join(alike) or 'none'}"
                                  if method.kind == "head" else ""))
        k = spec.num_speculative_tokens or 0
        need = min(len(prompt_ids) + params.max_tokens, self.max_model_len) + k + 1
        # the rows a forward may add: a prompt chunk, or drafts (token trees included) with their bonus row
        step_rows = self.sched_cfg.max_num_batched_tokens + k + 256
        if self.kv.peak_needed(need, step_rows) > self.sched_cfg.max_total_tokens:
            raise SpecDecError(f"the request needs {need} KV positions; the KV cache holds "
                               f"{self.sched_cfg.max_total_tokens} "
                               "(raise --max-total-tokens or lower max_tokens)")
        state = SpecState(spec.method, k, spec.prompt_lookup_max, spec.prompt_lookup_min, pool, spec.eagle_topk,
                          spec.num_steps or 0, prediction=spec.prediction, p_min=spec.draft_p_min)
        seq = Sequence(list(prompt_ids), params, self.tokenizer, self.eos_ids, self.max_model_len,
                       request_id=request_id, spec=state, device=self.device, arrival=time.perf_counter(),
                       cache_salt=salt_key(cache_salt))
        seq.stats.method, seq.stats.num_speculative_tokens = spec.method, k
        seq.stats.prompt_tokens = len(prompt_ids)
        if params.structured_outputs is not None:
            from ..sampling.grammar import Constraint

            seq.constraint = Constraint(params.structured_outputs, self.tokenizer)
        if wants_penalties(params):
            if params.logit_bias and max(params.logit_bias) >= self.vocab_size:
                raise SpecDecError(f"logit_bias: token id {max(params.logit_bias)} is not in the vocabulary "
                                   f"(ids 0..{self.vocab_size - 1})")
            seq.penalties = Penalties(params, seq.prompt_ids, seq.output_ids, self.eos_ids)
        self.drafting.assign(seq, self.num_running + self.num_waiting)
        # a learned head reads the target's hidden states at every prompt position, which an entry does not keep: an
        # EAGLE head's own cache rows stand for them, so a hit reaches no further than those
        reader = self.drafting.reader(seq)
        # prompt logprobs come from the prefill's rows: every prompt token is computed, none reused
        seq.reuse_prefix = self.kv.prefix is not None and params.prompt_logprobs is None
        if params.prompt_logprobs is not None:
            seq.prompt_logprobs = [None]
        seq.prefix_bound = reader.name if reader is not None and reader.prefix_needs_cache else None
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> Sequence | None:
        """Stop a request now: its KV and draft state are freed before the next step (or kept as a prefix entry).
        Returns it, if it ran."""
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self._release(seq, keep=True)
        return seq

    def _release(self, seq: Sequence, keep: bool = False) -> None:
        """Take a sequence out; with `keep` (it finished or was aborted, its caches intact) and prefix caching on,
        its caches become a prefix entry."""
        extras = None
        if keep and self.kv.prefix is not None and seq.num_computed > 0:
            extras = {name: kv for name, p in self.proposers.items()
                      if (kv := p.export_cache(seq.seq_id)) is not None}
        self.scheduler.remove(seq, extras)
        self._release_proposers(seq)

    def _restore_prefix(self, prefills: list[tuple[Sequence, int]]) -> None:
        """Sequences whose first chunk starts from a prefix entry: their proposers copy their part of it."""
        for seq, _ in prefills:
            hit = seq.prefix_hit
            if hit is None:
                continue
            seq.stats.cached_tokens = max(seq.stats.cached_tokens, hit.target)
            for proposer in self.drafting.uses(seq):
                source = (hit.entry.extras.get(proposer.name) if hit.entry is not None
                          else proposer.cache_of(hit.source_seq))
                if source is not None:
                    proposer.import_cache(seq.seq_id, source, hit.matched)
            self.kv.unpin(hit)
            seq.prefix_hit = None

    # -- prefix caching -------------------------------------------------------------------------------------
    SETTLE_TOKENS = 64      # prompt rows an idle step computes for a prefix entry (a new request waits at most that)

    def has_background_work(self) -> bool:
        """A prefix entry holds generated tokens whose K/V a next turn could not reuse as it stands (idle steps
        settle them). Never where rows are exact: an entry's only position without K/V is then its last token,
        which the next turn's prefill computes anyway."""
        return not self.runner.exact_rows and self.kv.prefix is not None and self.kv.prefix.to_settle() is not None

    def settle(self) -> int:
        """Compute the next chunk of a prefix entry's unsettled positions as prompt rows, so that a request sending
        those tokens back (a conversation's next turn) reuses them bit for bit. Returns the positions computed."""
        if not self.has_background_work():
            return 0
        entry = self.kv.prefix.to_settle()
        if not entry.kv.serves(entry.exact):      # a windowed cache that slid past what its rows would attend
            entry.tokens = entry.tokens[: entry.exact]
            return 0
        n = min(self.SETTLE_TOKENS, entry.unsettled)
        self.runner.compute_prompt_rows(entry.kv, entry.exact, entry.tokens[entry.exact:entry.exact + n].tolist())
        entry.exact += n
        entry.kv.length = max(entry.kv.length, entry.exact)
        return n

    def prefix_cache_stats(self) -> dict:
        """Queries and hits in prompt tokens (vLLM's prefix_cache_queries / prefix_cache_hits), entries and size."""
        pc = self.kv.prefix
        if pc is None:
            return {"enabled": False}
        return {"enabled": True, "queries": pc.queries, "hits": pc.hits,
                "hit_rate": pc.hits / pc.queries if pc.queries else None, "entries": len(pc),
                "tokens": pc.tokens, "positions": pc.capacity, "bytes": pc.nbytes}

    def kv_usage(self) -> float:
        """The share of the KV budget running sequences hold (prefix-cache entries they could evict count as free,
        as vLLM's kv_cache_usage_perc counts cached blocks no request holds)."""
        kv = self.kv
        held = kv.allocated - (kv.prefix.evictable if kv.prefix is not None else 0)
        return held / kv.max_total_tokens if kv.max_total_tokens else 0.0

    def reset_prefix_cache(self) -> None:
        """Drop every prefix entry (vLLM's reset_prefix_cache)."""
        self.kv.clear_prefix_cache()

    def _release_proposers(self, seq: Sequence) -> None:
        for proposer in self.proposers.values():
            proposer.release(seq.seq_id)
        self.drafting.release(seq)

    # -- the step ---------------------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """One forward for every scheduled sequence. One caller at a time (the server's engine thread, or `LLM`)."""
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError("LLMEngine.step() called from two threads at once")
        try:
            return self._step()
        finally:
            self._stepping.release()

    def _step(self) -> list[StepOutput]:
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()                                   # 1. schedule
        for seq in batch.preempted:
            self._release_proposers(seq)
        if batch.empty:
            self.last_step = StepInfo()
            return []
        decodes, prefills = batch.decodes, batch.prefills
        self._restore_prefix(prefills)
        chunks = [(seq.num_computed, n) for seq, n in prefills]             # where each starts: what it costs
        try:
            plans = self.drafting.propose(decodes, batch.num_rows)                  # 2. propose
            t1 = time.perf_counter()
            run = self.runner.execute(decodes, [p.draft for p in plans], prefills, self.drafting.reader)   # 3. execute
            if decodes and not prefills:       # how long rows take now: auto re-prices its cost model by it
                self.drafting.observe_forward(run.num_rows, max(s.num_computed for s in decodes),
                                              time.perf_counter() - t1)
            self.drafting.read_prompts(prefills)
        except Exception as exc:  # noqa: BLE001 - the step's requests fail; the engine goes on
            return [self._fail(s, exc) for s in [*decodes, *(s for s, _ in prefills)]]
        self.last_step = StepInfo(len(decodes) + len(prefills), run.num_rows, sum(n for _, n in prefills),
                                  sum(len(p.draft) for p in plans), len(batch.preempted))
        # 4. verify every sequence that samples this step: decodes, and prompts whose last chunk just ran
        sampling = [(s, p, lg, h) for s, p, lg, h in zip(decodes, plans, run.decode_logits, run.decode_hidden)]
        sampling += [(seq, None, lg, None) for (seq, _), lg in zip(prefills, run.prompt_logits) if lg is not None]
        results = verify_step([Verification(lg, (p.draft if p else empty_draft()).token_ids,
                                            p.draft.q_draft if p else None, p.draft.parents if p else None,
                                            s.params, s.generator, s.constraint, s.penalties)
                               for s, p, lg, _ in sampling],
                              self.vocab_size)
        times = StepTimes(t0, t1, time.perf_counter())
        for (seq, n), rows in zip(prefills, run.prompt_rows):               # 5. commit
            if rows is not None:
                self._prompt_logprobs(seq, rows)
            self.committer.prompt_chunk(seq, n)
        outputs = []
        for (seq, plan, lg, hidden), (num_accepted, emitted, kept) in zip(sampling, results):
            try:
                committed, lps = self.committer.sampled(seq, plan, lg, num_accepted, emitted, kept, hidden, times)
            except Exception as exc:  # noqa: BLE001 - one request's failure is that request's error
                outputs.append(self._fail(seq, exc))
                continue
            outputs.append(self._output(seq, committed, lps))
        # how long prompt tokens take here: the scheduler sizes the next steps' chunks by it
        self.scheduler.observe(chunks, time.perf_counter() - t0)
        return outputs

    def _prompt_logprobs(self, seq: Sequence, rows: torch.Tensor) -> None:
        """The logprobs of the prompt tokens this chunk's rows predict (row at position p: token p + 1)."""
        start = seq.num_computed
        lo = max(len(seq.prompt_logprobs), start + 1)     # a preempted request's prompt is computed again: once each
        hi = min(len(seq.prompt_ids), start + 1 + rows.shape[0])
        if hi > lo:
            seq.prompt_logprobs += token_logprobs(rows[lo - start - 1: hi - start - 1, :self.vocab_size],
                                                  seq.prompt_ids[lo:hi], seq.params.prompt_logprobs)

    def _output(self, seq: Sequence, committed: list[int], logprobs=None) -> StepOutput:
        now = time.perf_counter()
        if seq.first_token_at is None:
            seq.first_token_at = now
            prompt_lps = seq.prompt_logprobs                # handed out once, with the first token
        else:
            prompt_lps = None
        if not seq.finished:
            return StepOutput(seq.request_id, StreamDelta(seq.take_delta(), committed, False, None, logprobs=logprobs,
                                                          prompt_logprobs=prompt_lps))
        seq.stats.finish_reason = seq.finish_reason
        seq.stats.finalize(seq.arrival, seq.first_token_at, now)
        self._finish(seq)
        return StepOutput(seq.request_id, StreamDelta(seq.take_delta(), committed, True, seq.finish_reason, seq.stats,
                                                      logprobs=logprobs, prompt_logprobs=prompt_lps))

    def _finish(self, seq: Sequence) -> None:
        self.seqs.pop(seq.request_id, None)
        self._release(seq, keep=True)
        for proposer in self.proposers.values():          # what a pool's requests generate (suffix decoding)
            proposer.learn(seq.corpus, seq.prompt_ids, seq.output_ids)
        d, ctl = seq.spec.decision, seq.spec.controller
        if ctl is not None and ctl.switched:              # the request moved to the draft model mid-way
            seq.stats.policy_reason = f"{seq.stats.policy_reason}; {ctl.switched}"
        if d is not None:                                 # the one place the policy hears of an outcome
            self.drafting.policy.record(seq.spec.pool, d, seq.params.temperature, seq.stats, seq.spec.controller)

    def _fail(self, seq: Sequence, exc: Exception) -> StepOutput:
        self.seqs.pop(seq.request_id, None)
        self._release(seq)
        return StepOutput(seq.request_id, None, exc)
