"""Per-request state: tokens, text, termination (EOS, stop strings, max_tokens), stats, and the request's own
speculative state (method, k, the policy's decision and step controller)."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import torch

from ..config import PLAIN
from ..metrics.stats import RequestStats
from ..models.prefix_cache import Hit
from ..policy.decide import Decision, StepController
from ..sampling.grammar import Constraint
from ..sampling.penalties import Penalties
from ..sampling_params import SamplingParams
from ..tokenizer import IncrementalDetokenizer, Tokenizer

_ids = itertools.count()


@dataclass
class SpecState:
    """How this sequence speculates. `method` is what runs: none | ngram | draft | auto (the policy's step
    controller picks, per step, the draft's k or prompt lookup's guess). k: the fixed k, or auto's upper bound."""
    method: str = PLAIN
    k: int = 0
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    pool: str = "default"
    topk: int = 1                           # a learned head's token tree: guesses expanded per node (1: a chain)
    depth: int = 0                          # ... and its depth (a chain: k)
    decision: Decision | None = None        # the policy's choice (method auto)
    controller: StepController | None = None   # method auto, when it speculates: picks each step's proposer and k
    prediction: list[int] | None = None     # the request's predicted output (SpeculativeConfig.prediction)
    p_min: float = 0.0                      # the draft model's chain stops after a token it is less sure of


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    tokenizer: Tokenizer
    eos_ids: frozenset[int]
    max_len: int                                    # prompt + output may not exceed this
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    request_id: str = ""
    spec: SpecState = field(default_factory=SpecState)
    device: torch.device | str = "cpu"              # where the sampling generator lives (the model's device)
    arrival: float = 0.0                            # perf_counter at add_request
    first_token_at: float | None = None
    logprobs: list | None = None                    # TokenLogprob per output token, when params.logprobs is set
    prompt_logprobs: list | None = None             # per prompt token (None for the first), when asked
    constraint: Constraint | None = None            # structured outputs: the grammar's state
    penalties: Penalties | None = None              # repetition penalties, logit_bias, min_tokens (when asked)
    reuse_prefix: bool = False                      # may start from a prefix cache entry (set by the engine)
    prefix_bound: str | None = None                 # a proposer whose own cache in an entry bounds the reuse
    prefix_hit: Hit | None = None                   # the entry its first chunk started from, until the step's
                                                    # proposers took their part
    cache_salt: str = ""                            # its tenant's partition of the prefix cache and the suffix
                                                    # pools (prefix_cache.salt_key of its cache_salt; "": shared)

    def __post_init__(self):
        self.token_ids = list(self.prompt_ids)      # prompt + output
        # tokens whose K/V is in the target's cache; decoding keeps it at len(token_ids) - 1 (the newest token is
        # fed with the next step's draft)
        self.num_computed = 0
        seed = self.params.seed if self.params.seed is not None else random.getrandbits(63)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._detok = IncrementalDetokenizer(self.tokenizer)
        self._emitted = 0                           # chars of self.text already handed out
        self._stop_scan = 0                         # chars already searched for stop strings
        self._holdback = max((len(s) for s in self.params.stop), default=1) - 1
        self._stopped_by_string = False

    @property
    def corpus(self) -> str:
        """The pool name its proposers learn from and search (suffix decoding): its speculation pool, within its
        cache_salt's partition."""
        return f"{self.spec.pool}#{self.cache_salt}" if self.cache_salt else self.spec.pool

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        """True while tokens other than the newest still lack K/V (a new or preempted request)."""
        return self.num_computed < len(self.token_ids) - 1 or not self.output_ids

    @property
    def room(self) -> int:
        """Draft tokens worth verifying this step: past max_tokens or the context window they are wasted."""
        return max(0, min(self.params.max_tokens - len(self.output_ids), self.max_len - len(self.token_ids)) - 1)

    def append(self, new_ids: list[int]) -> list[int]:
        """Commit verified tokens one at a time until one ends the request; returns those committed."""
        taken = []
        for tok in new_ids:
            if self.finished:
                break
            taken.append(tok)
            self.output_ids.append(tok)
            self.token_ids.append(tok)
            # min_tokens (vLLM's rule): no EOS among the first min_tokens tokens (the sampler masks it), no stop
            # string before min_tokens tokens are out
            if tok in self.eos_ids and not self.params.ignore_eos and len(self.output_ids) > self.params.min_tokens:
                self.finish_reason = "stop"
                break
            self.text += self._detok.add([tok])
            if self.params.stop and len(self.output_ids) < self.params.min_tokens:
                self._stop_scan = len(self.text)
            elif self.params.stop and self._check_stop():
                break
            if len(self.output_ids) >= self.params.max_tokens or len(self.token_ids) >= self.max_len:
                self.finish_reason = "length"
        if self.finished and not self._stopped_by_string:
            self.text += self._detok.flush()   # text held back for an incomplete character
        self.stats.completion_tokens = len(self.output_ids)
        return taken

    def _check_stop(self) -> bool:
        start = max(0, self._stop_scan - self._holdback)
        hits = [i for i in (self.text.find(s, start) for s in self.params.stop) if i >= 0]
        self._stop_scan = len(self.text)
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        self.finish_reason = "stop"
        self._stopped_by_string = True
        return True

    def take_delta(self) -> str:
        """Text not yet handed out. While running, hold back a possible stop-string prefix."""
        end = len(self.text) if self.finished else max(self._emitted, len(self.text) - self._holdback)
        delta = self.text[self._emitted:end]
        self._emitted = end
        return delta
