"""Per-request choice of (method, k): pure functions of the request, the pool's observed acceptance and the
measured cost model. `choose` returns a Decision with one short reason; `KController` re-chooses k after every
verification of a running request.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .cost_model import CostModel, best_k, expected_tokens


@dataclass
class PolicyConfig:
    k_max: int = 8                    # largest k the policy may pick
    min_max_tokens: int = 16          # requests allowed fewer new tokens than this run plain (nothing to amortise)
    max_load: int = 4                 # running + waiting requests above this -> plain (no idle compute to spend)
    min_speedup: float = 1.05         # an expected speedup below this is within noise -> plain
    min_acceptance: float = 0.4       # a pool whose windowed acceptance falls below this falls back to plain
    window: int = 16                  # pool window, in speculative requests
    min_window_tokens: int = 24       # draft tokens a window needs before the pool can be judged
    probe_fraction: float = 0.1       # share of a disabled pool's requests that still speculate, to re-test it
    prior_alpha: dict = field(default_factory=lambda: {"draft": 0.8, "ngram": 0.3})  # before any observation
    explore_requests: int = 1         # requests per (pool, temperature bucket) each method gets before exploiting

    def __post_init__(self):
        if not 1 <= self.k_max <= 32:
            raise ValueError(f"k_max must be in 1..32, got {self.k_max}")
        if not 0 <= self.probe_fraction <= 1:
            raise ValueError(f"probe_fraction must be in [0, 1], got {self.probe_fraction}")
        if not 0 <= self.min_acceptance < 1:
            raise ValueError(f"min_acceptance must be in [0, 1), got {self.min_acceptance}")


@dataclass
class RequestFeatures:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    load: int = 0                     # running + waiting requests when this one arrives


@dataclass
class Decision:
    method: str                       # none | ngram | draft
    k: int
    expected_speedup: float
    reason: str
    alpha: float | None = None        # the acceptance estimate the choice used
    arm: str = "spec"                 # rollout arm: spec | plain
    probe: bool = False               # a disabled pool's probe request
    gated: bool = False               # plain because of the request itself (short output, high load)


def temperature_bucket(temperature: float) -> str:
    """Acceptance is tracked separately for greedy, moderate and high temperatures (it falls as T rises)."""
    if temperature < 1e-5:
        return "greedy"
    return "low" if temperature <= 0.7 else "high"


def prior_alpha(method: str, temperature: float, cfg: PolicyConfig) -> float:
    """Before a pool has data: the configured prior, lowered for sampling (draws disagree more often)."""
    base = cfg.prior_alpha.get(method, 0.5)
    return base * (1.0 - 0.3 * min(temperature, 1.0))


def effective_alpha(mean_accepted_length: float, k: int) -> float:
    """The α for which E(α, k) equals an observed number of tokens per target forward (bisection; E increases
    with α).

    Acceptance is bursty (a copied span is accepted whole, then nothing) and an n-gram proposer often finds
    nothing to propose, so accepted/drafted says little about what a step yields; matching the observed tokens
    per forward keeps the cost model honest.
    """
    target = min(max(mean_accepted_length, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def choose(features: RequestFeatures, alphas: dict[str, float | None], cost: CostModel, cfg: PolicyConfig,
           available: tuple[str, ...] = ("ngram", "draft")) -> Decision:
    """Pick none / ngram / draft and k to maximise the expected speedup S(α, k).

    >>> cm = CostModel(draft_step=0.4, verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16])
    >>> d = choose(RequestFeatures(max_tokens=256), {"draft": 0.9, "ngram": 0.1}, cm, PolicyConfig())
    >>> (d.method, d.k)
    ('draft', 4)
    """
    if features.max_tokens < cfg.min_max_tokens:
        return Decision("none", 0, 1.0, f"max_tokens {features.max_tokens} < {cfg.min_max_tokens}: too short to pay",
                        gated=True)
    if features.load > cfg.max_load:
        return Decision("none", 0, 1.0, f"load {features.load} > {cfg.max_load}: no idle compute to spend", gated=True)
    k_max = min(cfg.k_max, features.max_tokens - 1)
    best: Decision | None = None
    for method in available:
        alpha = alphas.get(method)
        observed = alpha is not None
        if alpha is None:
            alpha = prior_alpha(method, features.temperature, cfg)
        k, s = best_k(method, alpha, cost, k_max)
        if k and (best is None or s > best.expected_speedup):
            src = "observed" if observed else "prior"
            best = Decision(method, k, s, f"{method} k={k}: {src} α={alpha:.2f} -> expected {s:.2f}x", alpha)
    if best is None or best.expected_speedup < cfg.min_speedup:
        if best is None:
            return Decision("none", 0, 1.0, "no method is expected to beat plain decoding")
        return Decision("none", 0, 1.0, f"best {best.method} k={best.k} expected {best.expected_speedup:.2f}x "
                                        f"< {cfg.min_speedup:.2f}x (α={best.alpha:.2f})", best.alpha)
    return best


class KController:
    """Adaptive k within one request: after each verification, re-estimate α and re-choose k.

    The estimate is the effective α of the request's own steps (tokens committed per verification, which keeps
    bursty n-gram copies honest), blended with the pool's α as a prior worth `prior_steps` steps, so a few early
    rejections do not collapse k. The engine asks `next_k()` before each step and reports `observe()`.
    """

    prior_steps = 2.0

    def __init__(self, method: str, k: int, alpha: float, cost: CostModel, cfg: PolicyConfig):
        self.method, self.k, self.cost, self.cfg = method, k, cost, cfg
        self.prior_alpha = alpha
        self.drafted = 0
        self.accepted = 0
        self.steps = 0

    @property
    def alpha(self) -> float:
        if not self.steps:
            return self.prior_alpha
        own = effective_alpha(1 + self.accepted / self.steps, max(1, round(self.drafted / self.steps)))
        w = self.prior_steps
        return (self.prior_alpha * w + own * self.steps) / (w + self.steps)

    def next_k(self) -> int:
        return self.k

    def observe(self, num_draft: int, num_accepted: int) -> None:
        if num_draft == 0:
            return
        self.drafted += num_draft
        self.accepted += num_accepted
        self.steps += 1
        k, s = best_k(self.method, self.alpha, self.cost, self.cfg.k_max)
        self.k = k if s >= self.cfg.min_speedup else 0
