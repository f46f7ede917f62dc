"""Pools, the acceptance monitor and the rollout split.

A pool is the served model plus a request tag (e.g. `"spec_pool": "code"`). Each pool keeps a window of its
recent speculative requests: drafted/accepted tokens, verification steps and k, per method and temperature
bucket (a request run by a step controller gives one observation for its draft steps and one for prompt
lookup's guesses, verified or shadowed), plus the measured net speedup (the cost model's time for plain
decoding of the same tokens / the actual decode time). When the window's acceptance falls below
`min_acceptance` the pool falls back to plain decoding (one WARNING), keeps sending a `probe_fraction` of
requests through speculation, and re-enables when the newest probes' acceptance is back above the threshold.
"""
from __future__ import annotations

import collections
import hashlib
import logging
import threading
from dataclasses import dataclass, field

from ..config import PLAIN
from ..proposers.registry import draft_model_method, get_method, lookup_method
from .clock import StepClock
from .cost_model import CostModel, prompt_read
from .decide import (
    Decision,
    Guesser,
    PolicyConfig,
    RequestFeatures,
    StepController,
    choose,
    default_candidates,
    effective_alpha,
    prior_alpha,
    temperature_bucket,
)

# a draft model is explored (its first requests in a pool, run whatever the policy expects) only on prompts whose read
# costs at most this share of the request's plain decode: a long prompt's read would land in that request's decode
EXPLORE_READ = 0.1

log = logging.getLogger("specdec.policy")


def unit_hash(request_id: str, salt: str = "") -> float:
    """A stable number in [0, 1) per request id (the same id always lands in the same arm)."""
    h = hashlib.sha256(f"{salt}:{request_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def rollout_arm(request_id: str, fraction: float) -> str:
    return "spec" if unit_hash(request_id, "rollout") < fraction else "plain"


@dataclass
class Observation:
    method: str
    bucket: str
    k: int                    # mean draft length over the steps that drafted
    drafted: int
    accepted: int
    steps: int                # verification steps with a non-empty draft
    forwards: int             # all decode-phase target forwards (steps without a draft included)
    tokens: int               # decode-phase tokens (after the first)
    net_speedup: float | None
    by_n: dict = field(default_factory=dict)   # lookup: match length -> StepController.by_n's record
    size: int = 0             # the request's prompt, size_class(prompt tokens)


def size_class(prompt_tokens: int) -> int:
    """A prompt's size class, its token count's bit length (0-1, 2-3, 4-7, ..., 32-63, 64-127 tokens, ...).

    Prompt lookup copies what the prompt holds, so its record is kept by the size of the prompts it was seen on: in
    one pool, the code edits and summaries (100-170 tokens here, most of it text to copy) set lookup's α at 0.6-0.7,
    and a code-generation request (40-60 tokens, an instruction) then started on the matches alone and ran ~8 nearly
    plain steps before it moved to the draft (0.85 of the fixed draft in process, docs/benchmarks/auto-vs-fixed)."""
    return max(0, int(prompt_tokens)).bit_length()


@dataclass
class Pool:
    name: str
    window: collections.deque = field(default_factory=collections.deque)   # per request: its observations
    enabled: bool = True
    warned: bool = False
    probes: list = field(default_factory=list)      # per request since the pool was disabled: its observations
    requests: int = 0
    fallbacks: int = 0

    def observations(self, requests=None) -> list[Observation]:
        """The observations of the window's requests (or of the given requests), flattened."""
        return [o for found in (self.window if requests is None else requests) for o in found]

    @staticmethod
    def _alpha(obs: list[Observation], prior: float | None = None, prior_tokens: int = 0) -> float | None:
        """Effective α of one method's observations: reproduces their tokens per target forward. With a prior,
        weighed against it by evidence: the observed α counts for the token slots the drafts were offered (k per
        target forward), the prior for `prior_tokens` of them."""
        forwards = sum(o.forwards for o in obs)
        steps = sum(o.steps for o in obs)
        if not forwards:
            return None
        if not steps:
            observed, k = 0.0, 1          # it never had anything to propose
        else:
            k = max(1, round(sum(o.k * o.steps for o in obs) / steps))
            observed = effective_alpha(sum(o.tokens for o in obs) / forwards, k)
        if prior is None or prior_tokens <= 0:
            return observed
        slots = k * forwards
        return (slots * observed + prior_tokens * prior) / (slots + prior_tokens)

    def acceptance(self, obs: list[Observation] | None = None, priors: dict[str, float] | None = None,
                   prior_tokens: int = 0) -> float | None:
        """The pool's acceptance: the best method's effective α over the observations (the pool is useful
        while any method is), each weighed against its prior where `priors` has one."""
        obs = self.observations() if obs is None else obs
        priors = priors or {}
        alphas = [self._alpha([o for o in obs if o.method == m], priors.get(m), prior_tokens)
                  for m in dict.fromkeys(o.method for o in obs)]
        alphas = [a for a in alphas if a is not None]
        return max(alphas) if alphas else None

    def alpha(self, method: str, bucket: str, prior: float | None = None, prior_tokens: int = 0,
              size: int | None = None) -> float | None:
        obs = self._matching(method, bucket, size)
        return self._alpha(obs, prior, prior_tokens) if obs else None

    def _matching(self, method: str, bucket: str, size: int | None = None) -> list[Observation]:
        """The method's observations in this temperature bucket; with a size class, those of prompts of that size,
        else of the nearest size seen (the smaller on a tie), so a pool's first request of a new size reads them all
        as before."""
        obs = [o for o in self.observations() if o.method == method and o.bucket == bucket]
        if size is None or not obs:
            return obs
        near = min({o.size for o in obs}, key=lambda c: (abs(c - size), c))
        return [o for o in obs if o.size == near]

    def count(self, method: str, bucket: str | None = None) -> int:
        return sum(1 for o in self.observations() if o.method == method and (bucket is None or o.bucket == bucket))

    def estimate(self, method: str, bucket: str, prior: float | None = None, prior_tokens: int = 0,
                 size: int | None = None) -> float | None:
        """This bucket's α (weighed against `prior`), else one borrowed from the nearest bucket; None before any
        observation."""
        a = self.alpha(method, bucket, prior, prior_tokens, size)
        return a if a is not None else self.borrowed_alpha(method, bucket, prior, prior_tokens, size)

    def borrowed_alpha(self, method: str, bucket: str, prior: float | None = None,
                       prior_tokens: int = 0, size: int | None = None) -> float | None:
        """No observation in this temperature bucket: the nearest other bucket's α (weighed against the prior as
        there), lowered when this bucket is hotter (sampled draws agree less often)."""
        order = ["greedy", "low", "high"]
        here = order.index(bucket)
        for other in sorted((b for b in order if b != bucket), key=lambda b: abs(order.index(b) - here)):
            a = self.alpha(method, other, prior, prior_tokens, size)
            if a is not None:
                return a * (0.85 ** max(0, here - order.index(other)))
        return None

    def lookup_prior(self, bucket: str, size: int | None = None) -> dict[int, tuple[float, float, float, float]]:
        """The window's prompt-lookup record per match length (this temperature bucket; with a size class, of the
        prompts nearest that size), the prior for the next request's step controller."""
        total: dict[int, list[float]] = {}
        for o in self._matching(lookup_method(), bucket, size):
            for n, rec in o.by_n.items():
                t = total.setdefault(n, [0.0] * len(rec))
                t[:] = [a + b for a, b in zip(t, rec)]
        return {n: tuple(t) for n, t in total.items()}

    def net_speedup(self) -> float | None:
        xs = [o.net_speedup for o in self.observations() if o.net_speedup]
        return sum(xs) / len(xs) if xs else None

    def status(self, priors: dict[str, float] | None = None, prior_tokens: int = 0) -> dict:
        """The pool's state; `acceptance` as the monitor judges it (weighed against `priors`), raw_acceptance the
        window's accepted / drafted."""
        acc, obs = self.acceptance(None, priors, prior_tokens), self.observations()
        return {"pool": self.name, "enabled": self.enabled, "window_requests": len(self.window),
                "acceptance": acc, "net_speedup": self.net_speedup(), "requests": self.requests,
                "fallbacks": self.fallbacks,
                "raw_acceptance": (sum(o.accepted for o in obs) / sum(o.drafted for o in obs))
                if any(o.drafted for o in obs) else None}


class SpeculationPolicy:
    """`decide()` per request, `controller()` for adaptive k, `record()` when it finishes. Thread-safe."""

    def __init__(self, cost: CostModel, cfg: PolicyConfig | None = None,
                 available: tuple[str, ...] | None = None,
                 on_pool_change=None, max_context: dict[str, int] | None = None,
                 matched: tuple[str, ...] = ()):
        self.cost = cost                      # as the machine runs now: the measured one re-priced by the clock
        self.cfg = cfg or PolicyConfig()
        self.clock = StepClock(cost, self.cfg.clock_window) if self.cfg.clock_window else None
        self.available = available or default_candidates()
        self.max_context = dict(max_context or {})     # method -> the longest prompt it is weighed for
        # the free proposers whose matches the step controller weighs beside a model at every step of every speculative
        # request (prompt lookup always; suffix decoding; Proposer.matches), kept as prompt lookup's record
        self.matched = {lookup_method(), *matched}
        self.pools: dict[str, Pool] = {}
        self._lock = threading.Lock()
        self._on_pool_change = on_pool_change or (lambda name, enabled: None)

    def set_listener(self, on_pool_change) -> None:
        """on_pool_change(pool_name, enabled) is called for every pool now and on every change later."""
        with self._lock:
            self._on_pool_change = on_pool_change
            for p in self.pools.values():
                on_pool_change(p.name, p.enabled)

    def observe_forward(self, rows: int, context: int, seconds: float) -> None:
        """A decode step's target forward as the engine timed it (rows after `context` tokens): the clock's
        evidence; requests decided after the model is re-priced see the new one."""
        if self.clock is not None:
            cost = self.clock.observe(rows, context, seconds)
            if cost is not None:
                self.cost = cost

    def wants_plain_step(self) -> bool:
        """Whether a lone sequence's next step should be plain, so the clock has a plain step of this moment to
        price the rows and the draft's chains against (StepClock.wants_plain)."""
        return self.clock is not None and self.clock.wants_plain()

    def observe_draft(self, forwards: int, context: int, seconds: float) -> None:
        """The draft model's chain of `forwards` one-row steps after `context` tokens, as the engine timed it: read
        into c when the clock next re-prices (after a target step)."""
        if self.clock is not None:
            self.clock.observe_draft(forwards, context, seconds)

    def pool(self, name: str) -> Pool:
        with self._lock:
            if name not in self.pools:
                self.pools[name] = Pool(name, collections.deque(maxlen=self.cfg.window))
                self._on_pool_change(name, True)
            return self.pools[name]

    def decide(self, request_id: str, pool_name: str, features: RequestFeatures) -> Decision:
        pool = self.pool(pool_name)
        pool.requests += 1
        bucket = temperature_bucket(features.temperature)
        size = size_class(features.context)
        alphas = {m: self._estimate(pool, m, bucket, features.temperature, size) for m in self.available}
        d = choose(features, alphas, self.cost, self.cfg, self.available, self.max_context)
        if d.gated:
            return d
        if pool.enabled and d.method == PLAIN:
            # the observed acceptance rules speculation out before the window is full: judge the pool now
            with self._lock:
                self._judge(pool, force=True)
        if pool.enabled:
            # the draft gets a few requests per pool before its estimate is trusted (other temperature buckets'
            # observations count: they inform this bucket through borrowed_alpha)
            unexplored = self._unexplored(pool)
            if unexplored and d.method not in unexplored:
                m = unexplored[0]
                e = choose(features, {m: None}, self.cost, self.cfg, (m,), self.max_context)
                if e.gated:
                    return d                 # the draft cannot pay for reading this prompt: nothing to learn here
                read = prompt_read(self.cost.at(features.context), features.context, features.max_tokens)
                if get_method(m).needs == "draft_model" and read > EXPLORE_READ:
                    return d                 # learn the draft's acceptance on a prompt it reads cheaply
                k = e.k or 1
                return Decision(m, k, e.expected_speedup, f"exploring {m} k={k} in pool '{pool_name}' "
                                f"({bucket}): no observation yet",
                                e.alpha or prior_alpha(m, features.temperature, self.cfg), explore=True)
            return d
        if unit_hash(request_id, "probe") < self.cfg.probe_fraction:
            # a probe asks whether speculation pays again: judge it from the priors, not the stale window
            d = choose(features, {}, self.cost, self.cfg, self.available, self.max_context)
            if d.method != PLAIN:
                d.probe = True
                d.reason = f"probe of disabled pool '{pool_name}': {d.reason}"
                return d
        acc = self._acceptance(pool)
        return Decision(PLAIN, 0, 1.0, f"pool '{pool_name}' disabled: windowed acceptance "
                                        f"{acc if acc is not None else 0:.2f} < {self.cfg.min_acceptance}", acc)

    def controller(self, decision: Decision, pool_name: str = "default",
                   temperature: float = 0.0, context: int = 0, guesser: Guesser | None = None,
                   max_tokens: int = 0) -> StepController | None:
        """The step controller of a speculative request: the draft (when chosen) with the decision's k, prompt
        lookup with the pool's record for this temperature as its prior; priced at the request's context. A head's
        request may move to the draft model (its pool α the prior) where the head's own record falls short."""
        if decision.method == PLAIN:
            return None
        bucket = temperature_bucket(temperature)
        pool = self.pool(pool_name)
        ngram = lookup_method()
        size = size_class(context)
        lookup_alpha = self._estimate(pool, ngram, bucket, temperature, size)
        draft = draft_model_method()
        fallback = None
        if draft in self.available and draft != decision.method and max_tokens:
            alpha = self._estimate(pool, draft, bucket, temperature)
            fallback = (draft, alpha if alpha is not None else prior_alpha(draft, temperature, self.cfg))
        return StepController(decision.method, decision.k, decision.alpha or 0.5, self.cost.at(context), self.cfg,
                              lookup_alpha if lookup_alpha is not None else prior_alpha(ngram, temperature, self.cfg),
                              pool.lookup_prior(bucket, size), use_lookup=ngram in self.available, guesser=guesser,
                              explore=decision.explore, fallback=fallback, prompt_len=context, max_tokens=max_tokens)

    def record(self, pool_name: str, decision: Decision, temperature: float, stats,
               controller: StepController | None = None) -> None:
        """Feed a finished request into its pool and re-judge the pool: its stats (a RequestStats) and, when it
        ran under a step controller, the draft's and prompt lookup's records kept apart."""
        if decision.method == PLAIN:
            return
        net = None
        decode_s = stats.e2e_s - stats.ttft_s
        if self.cost.target_step_s and decode_s > 0 and stats.completion_tokens > 1:
            net = (stats.completion_tokens - 1) * self.cost.target_step_s / decode_s
        bucket = temperature_bucket(temperature)
        size = size_class(controller.prompt_len if controller is not None else stats.prompt_tokens)
        found = []
        if controller is None:
            if stats.draft_steps:
                k = max(1, round(stats.draft_tokens / stats.draft_steps))
                found.append(Observation(decision.method, bucket, k, stats.draft_tokens, stats.accepted_tokens,
                                         stats.draft_steps, max(1, stats.target_forwards),
                                         max(0, stats.completion_tokens - 1), net, size=size))
        else:
            c = controller
            for model, drafted, accepted, steps in c.retired:    # a head the request moved away from
                found.append(Observation(model, bucket, max(1, round(drafted / steps)), drafted, accepted, steps,
                                         steps, steps + accepted, None))
            if c.steps:
                found.append(Observation(c.model, bucket, max(1, round(c.drafted / c.steps)), c.drafted, c.accepted,
                                         c.steps, c.steps, c.steps + c.accepted, None if c.retired else net))
            ngram = lookup_method()
            if c.lookup_evaluated and ngram in self.available:
                found.append(Observation(ngram, bucket, max(1, round(c.lookup_proposed / max(1, c.lookup_guesses))),
                                         c.lookup_proposed, c.lookup_matched, c.lookup_guesses, c.lookup_evaluated,
                                         c.lookup_evaluated + c.lookup_matched, net if not c.steps else None,
                                         {n: tuple(r) for n, r in c.by_n.items()}, size))
        if not found:
            return
        pool = self.pool(pool_name)
        with self._lock:
            pool.window.append(found)
            if not pool.enabled:
                pool.probes.append(found)
            self._judge(pool)

    def _unexplored(self, pool: Pool) -> list[str]:
        """The methods this pool has not yet run on `explore_requests` requests, but for those whose matches the step
        controller weighs at every step of every speculative request (self.matched: prompt lookup, suffix decoding),
        whose record it keeps. A request given to suffix decoding alone to learn its α ran at 0.77x the draft's speed
        where it fell on code generation (served-intel-amx-r5, docs/benchmarks/auto-vs-fixed), and that α only
        prices it alone, where no model proposer pays -- which its matches' record beside the model shows as well."""
        return [m for m in self.available if m not in self.matched and pool.count(m) < self.cfg.explore_requests]

    def _estimate(self, pool: Pool, method: str, bucket: str, temperature: float,
                  size: int | None = None) -> float | None:
        """A method's α in this pool and bucket, weighed against its prior by evidence (PolicyConfig.prior_tokens);
        the matches' (prompt lookup's, suffix decoding's) from the prompts nearest this request's `size` class.
        A cache (suffix decoding) that has not run alone here takes the matches' record (prompt lookup's): its
        guesses are part of it, and its prior would price matches the record has seen fail."""
        size = size if method in self.matched else None
        own = pool.estimate(method, bucket, prior_alpha(method, temperature, self.cfg), self.cfg.prior_tokens, size)
        ngram = lookup_method()
        if own is None and method != ngram and method in self.matched and ngram in self.available:
            return pool.estimate(ngram, bucket, prior_alpha(ngram, temperature, self.cfg), self.cfg.prior_tokens,
                                 size)
        return own

    def _acceptance(self, pool: Pool, obs: list[Observation] | None = None) -> float | None:
        """The pool's acceptance with each method weighed against its greedy prior (what decide() weighs)."""
        return pool.acceptance(obs, self.cfg.prior_alpha, self.cfg.prior_tokens)

    def _judge(self, pool: Pool, force: bool = False) -> None:
        cfg = self.cfg
        if pool.enabled:
            if not force and sum(o.drafted for o in pool.observations()) < cfg.min_window_tokens:
                return
            ngram = lookup_method()
            if self._unexplored(pool) or (ngram in self.available and pool.count(ngram) < cfg.explore_requests):
                return        # one method's poor first try says nothing about the other's: judge after both
            acc = self._acceptance(pool)
            if acc is not None and acc < cfg.min_acceptance:
                pool.enabled = False
                pool.fallbacks += 1
                pool.probes = []
                if not pool.warned:
                    log.warning("speculation pool '%s' falls back to plain decoding: windowed acceptance %.2f < %.2f "
                                "over %d requests; probing %.0f%% of its requests", pool.name, acc,
                                cfg.min_acceptance, len(pool.window), 100 * cfg.probe_fraction)
                    pool.warned = True
                self._on_pool_change(pool.name, False)
        elif sum(o.drafted for o in pool.observations(pool.probes)) >= cfg.min_window_tokens:
            acc = self._acceptance(pool, pool.observations(pool.probes))
            if acc is not None and acc >= cfg.min_acceptance + 0.05:
                pool.enabled = True
                pool.window.clear()                 # the stale window would veto speculation again
                pool.window.extend(pool.probes[-cfg.window:])
                log.info("speculation pool '%s' re-enabled: acceptance %.2f over %d probes",
                         pool.name, acc, len(pool.probes))
                self._on_pool_change(pool.name, True)
            pool.probes = pool.probes[-cfg.window:]

    def status(self) -> dict:
        with self._lock:
            pools = [p.status(self.cfg.prior_alpha, self.cfg.prior_tokens) for p in self.pools.values()]
        return {"cost_model": self.cost.to_dict(),
                "measured_cost_model": self.clock.measured.to_dict() if self.clock is not None else None,
                "clock": self.clock.status() if self.clock is not None else None,
                "config": {k: v for k, v in vars(self.cfg).items()}, "pools": pools}
