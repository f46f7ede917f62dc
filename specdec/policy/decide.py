"""Per-request choice of (method, k): pure functions of the request, the pool's observed acceptance and the
measured cost model. `choose` returns a Decision with one short reason; `StepController` re-chooses, before every
step of a running request, between the draft model (and its k) and prompt lookup.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import K_MAX, K_MIN, PLAIN
from ..proposers.registry import METHOD_TABLE, draft_model_method, get_method, lookup_method
from .cost_model import (
    CostModel,
    StepBudget,
    amortized,
    best_k,
    expected_tokens,
    prices,
    prompt_read,
    proposal_cost,
)

# StepController's two sources of a step's draft: its model proposer (k draft steps) or prompt lookup's guess
MODEL, LOOKUP = "model", "lookup"
# prompt lookup's guess for a sequence: (token_ids, room, grammar constraint or None) -> (matched n-gram length,
# up to `room` tokens the grammar allows); the engine hands the controller its lookup proposer's
Guesser = Callable[[list[int], int, object], tuple[int, list[int]]]


def default_candidates() -> tuple[str, ...]:
    """What the policy weighs when the caller does not say: prompt lookup and the draft model."""
    return (lookup_method(), draft_model_method())


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
    prior_alpha: dict = field(default_factory=lambda: {m.name: m.prior_alpha for m in METHOD_TABLE.values()
                                                        if m.prior_alpha is not None})
                                      # acceptance before any observation
    explore_requests: int = 1         # requests per (pool, temperature bucket) each method gets before exploiting
    # the prior counts as this many token slots of evidence: a method's estimate moves from its prior to what the
    # pool observed as its drafts offer more slots (k per verification), so one short first try on an odd prompt
    # (a draft abandoned after three steps) neither rules a method out nor turns the pool off
    prior_tokens: int = 8
    # decode steps whose timing re-prices the cost model's rows as the machine runs now (policy/clock.py); 0 keeps
    # the model as measured
    clock_window: int = 64
    # a learned head starts a request in place of the draft model only where it is expected to decode this much
    # faster (each with prompt lookup beside it, the draft's read paid)
    head_margin: float = 1.1
    # where the draft model with its read paid is expected to decode this much faster than the matches alone, a
    # request starts on the pair at once instead of on the matches (the margin by which its first steps would move
    # it there, StepController.switch_margin); inf: the matches first wherever they pay
    pair_margin: float = 1.1

    def __post_init__(self):
        if not K_MIN <= self.k_max <= K_MAX:
            raise ValueError(f"k_max must be in {K_MIN}..{K_MAX}, got {self.k_max}")
        if not 0 <= self.probe_fraction <= 1:
            raise ValueError(f"probe_fraction must be in [0, 1], got {self.probe_fraction}")
        if not self.head_margin > 0:
            raise ValueError(f"head_margin must be > 0, got {self.head_margin}")
        if not self.pair_margin > 0:
            raise ValueError(f"pair_margin must be > 0, got {self.pair_margin}")
        if self.clock_window < 0:
            raise ValueError(f"clock_window must be >= 0, got {self.clock_window}")
        if not 0 <= self.min_acceptance < 1:
            raise ValueError(f"min_acceptance must be in [0, 1), got {self.min_acceptance}")


@dataclass
class RequestFeatures:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    load: int = 0                     # running + waiting requests when this one arrives
    context: int = 0                  # prompt tokens: rows and draft steps cost more after a long context


@dataclass
class Decision:
    method: str                       # a METHOD_TABLE name; PLAIN when speculation is not expected to pay
    k: int
    expected_speedup: float
    reason: str
    alpha: float | None = None        # the acceptance estimate the choice used
    arm: str = "spec"                 # rollout arm: spec | plain
    probe: bool = False               # a disabled pool's probe request
    gated: bool = False               # plain because of the request itself (short output, high load, a prompt
                                      # too long for the only method's draft model to pay for reading)
    explore: bool = False             # the pool's first try of this method: its k is run, not re-planned, until
                                      # the request has observed a few of its steps


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
    return steps_alpha(mean_accepted_length, {k: 1})


def steps_alpha(tokens: float, steps_by_k: dict[int, float]) -> float:
    """The α for which steps of these draft lengths (k -> how many) are expected to commit `tokens` in all,
    sum_k n_k E(α, k) = tokens (bisection; E increases with α). Each step is priced at its own k: one k for their
    mean would move α with the rounding of the mean (a request's steps at k 3 and 4 alternating read 0.86, then
    0.95 after one more step of 4 all accepted, and its k swung between 3 and 7 with them)."""
    steps = sum(steps_by_k.values())
    target = min(max(tokens, steps), sum(n * (k + 1.0) for k, n in steps_by_k.items()))
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if sum(n * expected_tokens(mid, k) for k, n in steps_by_k.items()) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def choose(features: RequestFeatures, alphas: dict[str, float | None], cost: CostModel, cfg: PolicyConfig,
           available: tuple[str, ...] | None = None, max_context: dict[str, int] | None = None) -> Decision:
    """Pick a method (or plain decoding) and k to maximise the expected speedup S(α, k); `available`: the
    methods to weigh (default_candidates()); `max_context`: the longest prompt a method is weighed for (a learned
    head past the context it was trained at).

    >>> cm = CostModel(draft_step=0.4, verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16])
    >>> d = choose(RequestFeatures(max_tokens=256), {"draft": 0.9, "ngram": 0.1}, cm, PolicyConfig())
    >>> (d.method, d.k)
    ('draft', 4)
    """
    available = available or default_candidates()
    if features.max_tokens < cfg.min_max_tokens:
        return Decision(PLAIN, 0, 1.0, f"max_tokens {features.max_tokens} < {cfg.min_max_tokens}: too short to pay",
                        gated=True)
    if features.load > cfg.max_load:
        return Decision(PLAIN, 0, 1.0, f"load {features.load} > {cfg.max_load}: no idle compute to spend", gated=True)
    k_max = min(cfg.k_max, features.max_tokens - 1)
    cost = cost.at(features.context)
    cands: dict[str, Decision] = {}
    skipped: list[str] = []
    read = prompt_read(cost, features.context, features.max_tokens)   # a draft model's, of this prompt
    for method in available:
        if not prices(method, cost):        # a cost model given by hand, or measured before the head was loaded
            skipped.append(f"no measured cost for {method}")
            continue
        limit = (max_context or {}).get(method)
        if limit is not None and features.context > limit:
            skipped.append(f"{method} was trained on contexts up to {limit} tokens, the prompt has {features.context}")
            continue
        alpha = alphas.get(method)
        observed = alpha is not None
        if alpha is None:
            alpha = prior_alpha(method, features.temperature, cfg)
        k, s = best_k(method, alpha, cost, k_max)
        # a draft model reads the whole prompt before its first draft; heads and lookups read nothing
        reads_prompt = get_method(method).needs == "draft_model"
        if k and reads_prompt and amortized(s, read) <= 1.0:       # its read costs more than its steps save
            skipped.append(f"the draft's {features.context}-token prompt read costs more than {s:.2f}x saves over "
                           f"{features.max_tokens} tokens")
            continue
        if k:
            src = "observed" if observed else "prior"
            cands[method] = Decision(method, k, s, f"{method} k={k}: {src} α={alpha:.2f} -> expected {s:.2f}x", alpha)
    if not cands:
        return Decision(PLAIN, 0, 1.0, "; ".join(skipped) or "no method is expected to beat plain decoding",
                        gated=len(skipped) == len(available))
    def overall(m: str, s: float) -> float:       # over the whole request: per-step speedup s, the prompt read paid
        return amortized(s, read if get_method(m).needs == "draft_model" else 0.0)
    best = max(cands.values(), key=lambda d: overall(d.method, d.expected_speedup))
    if best.expected_speedup < cfg.min_speedup:
        return Decision(PLAIN, 0, 1.0, f"best {best.method} k={best.k} expected {best.expected_speedup:.2f}x "
                                        f"< {cfg.min_speedup:.2f}x (α={best.alpha:.2f})", best.alpha)
    models = [d for m, d in cands.items() if get_method(m).drafts_with_model]
    draft = max(models, key=lambda d: overall(d.method, d.expected_speedup)) if models else None
    own = cands.get(draft_model_method())
    if draft is not None and own is not None and draft is not own and (
            overall(own.method, own.expected_speedup) * cfg.head_margin
            >= overall(draft.method, draft.expected_speedup)):
        # a head's estimate is its pool's α, which mixes every kind of prompt and says little of this one (served
        # code generation: EAGLE-3 accepted 0.30 where its pool said 0.60); the draft's α is this request's own after
        # a step or two, its k adapts down to 0, and lookup takes the copies either way. A head within the margin
        # of the draft started requests that then moved to the draft after 4-6 steps, or stayed at ~0.8x it
        # (docs/benchmarks/head-margin)
        own.reason += f" ({draft.method} expected {draft.expected_speedup:.2f}x: within {cfg.head_margin:.2f}x)"
        draft = own
    # the free proposers (prompt lookup; a cache: suffix decoding) guess beside a model proposer at every step (the
    # step controller is offered their longest match): a cache runs alone (token trees, no controller) only where no
    # model proposer pays, or where the draft's read leaves the pair behind it (chosen alone on short prompts, suffix
    # decoding ran at 0.84x the pairs' speed on the same prompts, lower on 10 of 12; docs/benchmarks/suffix-alone)
    free = max((d for m, d in cands.items() if get_method(m).free), key=lambda d: d.expected_speedup, default=None)
    if draft is not None and draft.expected_speedup >= cfg.min_speedup and lookup_method() in available:
        # the best model proposer runs whenever it pays: lookup still takes the steps where its guess is the better
        # bet (StepController), so the pair does at least as well per step as lookup alone. But a draft model's
        # prompt read is paid once, in the decode: the free proposer runs alone where even the pair's best case,
        # each proposer adding its own gain over plain (s_draft + s_free - 1; served long code edits came close to
        # it), would finish the request later than it alone once the read is paid
        s_free = free.expected_speedup if free is not None else 1.0
        pair = overall(draft.method, draft.expected_speedup + s_free - 1.0)
        if pair >= s_free:
            # a head reads nothing, and where no match is expected to pay there is nothing to wait for: the pair
            # starts at once
            if get_method(draft.method).needs != "draft_model" or free is None or s_free < cfg.min_speedup:
                draft.reason += f" (lookup where it beats the {draft.method})"
                return draft
            # where the matches alone are expected to fall short of the draft by the margin that would move the
            # request to it after its first steps, those steps would only be spent learning that: the pair starts at
            # once (lookup's record is read from prompts of this one's size, pools.size_class: code generation's
            # short instructions gave it 1.1-1.2x where the pool's edits and summaries gave it 2x)
            if overall(draft.method, draft.expected_speedup) >= s_free * cfg.pair_margin:
                draft.reason += (f" (lookup where it beats the {draft.method}; alone it is expected "
                                 f"{s_free:.2f}x)")
                return draft
            # the matches first: the request starts on them alone, and the draft model reads the context and drafts
            # from the step the request's own record says it would do better (StepController._maybe_switch). A
            # pool's α mixes requests a copy serves (summaries, edits: the draft's read and steps paid for nothing)
            # with ones it does not (code generation), and which of them had set the pool's estimates decided what
            # ran; the request's first steps tell them apart, for ~6% of a code generation's speed
            # (docs/benchmarks/suffix-alone)
            lone = cands.get(lookup_method()) or Decision(lookup_method(), 0, s_free, f"{lookup_method()}: the "
                                                          f"matches of {free.method}", free.alpha)
            lone.reason += (f"; the matches first, the {draft.method} (expected {draft.expected_speedup:.2f}x, "
                            f"{overall(draft.method, draft.expected_speedup):.2f}x with its read) when the "
                            f"request's own steps say it pays")
            return lone
        if free is not None:
            free.reason += (f"; alone: the {draft.method}'s {features.context}-token prompt read leaves the pair "
                            f"{pair:.2f}x over {features.max_tokens} tokens")
            return free
    return best


class StepController:
    """One request's step-by-step choice between the draft model and prompt lookup, and the draft's k.

    Draft: after each draft step, re-estimate α (the effective α of the request's own draft steps, which keeps
    bursty acceptance honest, blended with the pool's α as a prior worth `prior_steps` steps, so a few early
    rejections do not collapse k) and re-choose k; k = 0 once no k is expected to pay.

    Lookup: before each step the engine offers the prompt-lookup guess (free to make) with the length n of the
    matched n-gram; it is used instead of the draft when its expected yield per unit of time, from this
    request's record for matches of that length, beats the draft's. The record is kept at every step, also when
    the draft runs: the guess is compared with the tokens the target committed (for sampling, the chance that a
    committed token equals the guess is the chance the guess would have been accepted), so knowing what lookup
    would do costs nothing. Copy-heavy stretches of a request then go to lookup, the rest to the draft. A guess is
    priced by two odds, its first token's and each later one's once the one before it held (`lookup_acceptance`).

    A request that runs a learned head, or lookup alone, may move to the draft model once, where the draft is
    expected to do better than the request's own steps have (`_maybe_switch`).
    """

    prior_steps = 2.0
    explore_steps = 4                 # an exploring request's first model steps, run at its k whatever lookup offers
    switch_after = 4                  # a head's own steps before its record may send the request to the draft
    switch_margin = 1.1               # model, expected to decode this much faster, its read paid
    lookup_switch_after = 8           # a lookup's steps, guessed or not (after 4: level, summaries moved too early)
    lookup_prior_weight = 2.0         # proposals a prior is worth against this request's own record
    lookup_decay = 0.8                # per guess of the same match length: the record remembers ~5 guesses

    def __init__(self, method: str, k: int, alpha: float, cost: CostModel, cfg: PolicyConfig,
                 lookup_alpha: float = 0.3, lookup_prior: dict[int, tuple[float, float, float, float]] | None = None,
                 use_lookup: bool = True, guesser: Guesser | None = None, explore: bool = False,
                 fallback: tuple[str, float] | None = None, prompt_len: int = 0, max_tokens: int = 0):
        models = get_method(method).drafts_with_model
        self.model = method if models else draft_model_method()   # the model proposer: draft model or a head
        self.k = k if models else 0                       # prompt lookup chosen: lookup alone, no draft steps
        # exploring: the model's own record is what the pool lacks, and a k the prior says will not pay (or lookup
        # taking every step) would leave it without one, so the pool would explore again on every request
        self.explore = explore and models and k > 0
        self.cost, self.cfg = cost, cfg
        self.use_lookup = use_lookup                      # False: guesses are only scored, never verified
        self.prior_alpha = alpha
        self.drafted = self.accepted = self.steps = 0
        self.steps_by_k: dict[int, int] = {}             # the model's steps by their draft length
        self.own_alpha = 0.0                              # their α (steps_alpha), read after each of them
        self.lookup_alpha = lookup_alpha                  # prior α of a lookup guess
        self.lookup_prior = lookup_prior or {}            # the pool's record, same shape as by_n
        # this request's record, decayed: match length -> [guesses, first tokens held, later tokens tested (each
        # after the one before it held), later tokens held]
        self.by_n: dict[int, list[float]] = {}
        self.lookup_evaluated = 0                         # steps at which lookup was offered or shadowed
        self.lookup_matched = 0                           # tokens its guesses would have had accepted
        self.lookup_proposed = 0
        self.lookup_guesses = 0                           # steps that had a guess (undecayed, for the pool)
        self.lookup_steps = 0                             # steps that verified a lookup guess
        self.guesser = guesser                            # prompt lookup's guess (None: no guess to offer)
        self._last: tuple[str, int, list[int]] = (MODEL, 0, [])   # this step's (source, match length, guess)
        # a request of a learned head, or of a lookup running alone (prompt lookup, suffix decoding), may move to the
        # draft model (method, its pool α) once its own record says the draft would decode faster: one pool holds
        # every kind of prompt, and a method's pooled α (summaries, code edits) says little of one request (served
        # code generation: EAGLE-3 accepted 0.30 where the pool said 0.60 and the draft accepted 0.86). The draft
        # reads the context when first asked; a head could not join later, having read none of the target's states
        self.head = get_method(method).kind == "head"
        self.fallback = fallback if self.head or not models else None
        # what this request's steps gave, whichever proposer ran: tokens committed, and time in plain steps (the
        # verification's rows and the proposal, priced by the cost model)
        self.made, self.spent = 0, 0.0
        self.prompt_len, self.max_tokens, self.context = prompt_len, max_tokens, prompt_len
        self.retired: list[tuple[str, int, int, int]] = []   # (model, drafted, accepted, steps) of one left behind
        self.switched = ""                                # why it moved, for the request's policy reason

    @property
    def uses(self) -> tuple[str, ...]:
        """The proposers this request may draft with: its model proposer, and prompt lookup."""
        return (self.model, lookup_method()) if self.use_lookup else (self.model,)

    @property
    def alpha(self) -> float:
        if not self.steps:
            return self.prior_alpha
        w = self.prior_steps
        return (self.prior_alpha * w + self.own_alpha * self.steps) / (w + self.steps)

    @staticmethod
    def bucket(n: int) -> int:
        return min(n, 4)

    def lookup_acceptance(self, n: int) -> tuple[float, float]:
        """(first, rest): the odds that a lookup guess from a match of length n holds at its first token, and at
        each later one once the one before it held (expected_tokens' `rest`), from this request's record for that
        match length with the pool's record (or the prior α, for both) as a prior worth `lookup_prior_weight`
        guesses.

        One α for every token of a guess priced a copied span's later tokens as unlikely as its first: on long
        retrieval prompts most guesses come from 1-2 token matches, whose first token held 0.2-0.4 of the time but
        whose second held nearly always after it, so the plan verified 1 token a step where the fixed lookup's 4
        finished the request in 53 target forwards against 66."""
        b = self.bucket(n)
        own = self.by_n.get(b, [0.0, 0.0, 0.0, 0.0])
        prior = self.lookup_prior.get(b)
        w = self.lookup_prior_weight
        if prior and prior[0]:
            scale = min(1.0, w / prior[0])
            pg, pf, pt, ph = (x * scale for x in prior)
        else:
            pg, pf, pt, ph = w, w * self.lookup_alpha, w, w * self.lookup_alpha
        first = (own[1] + pf) / (own[0] + pg)
        rest = (own[3] + ph) / (own[2] + pt) if own[2] + pt > 0 else first
        return first, rest

    def plan(self, n: int, lookup_len: int, budget: StepBudget | None = None) -> tuple[str, int]:
        """(LOOKUP, tokens of the guess to verify) or (MODEL, k); (MODEL, 0) is a plain step.

        `budget` is what the step already carries (other sequences' rows): the draft's k and the guess's length
        are chosen for the step's expected rate, so a full batch leaves less room for drafts. It is updated with
        the choice. Without one, the sequence is alone in its step.
        """
        budget = budget or StepBudget(self.cost)
        if self.explore and self.steps < self.explore_steps:
            budget.add(self.model, self.alpha, self.k)
            return MODEL, self.k
        k_d, g_d = budget.best(self.model, self.alpha, self.k) if self.k else (0, 1.0)
        choice = (MODEL, k_d, g_d, self.alpha, None)
        if lookup_len and self.use_lookup:
            first, rest = self.lookup_acceptance(n)
            k_l, g_l = budget.best(lookup_method(), first, lookup_len, rest)
            if k_l and g_l > g_d:
                choice = (LOOKUP, k_l, g_l, first, rest)
        source, k, _, alpha, rest = choice
        budget.add(lookup_method() if source == LOOKUP else self.model, alpha, k, rest)
        return source, k

    def choose_step(self, token_ids: list[int], room: int, constraint, budget: StepBudget | None,
                    p_min: float = 0.0) -> tuple[str, int, list[int] | None]:
        """Before a step: (proposer, k, guess): prompt lookup with its guess's tokens to verify, or the model
        proposer and its k (guess None; k 0 is a plain step). The guess is scored after the step (observe_step)
        whichever ran. A grammar cuts the guess at its first forbidden token.

        p_min > 0: the draft model ends its chain itself after a token it is unsure of (SpeculativeConfig.draft_p_min),
        so a sequence alone in its step that drafts with it is given the whole room: the plan's k, sized for an α
        that is the same at every position, says whether to draft, the draft's own confidence how far. In a batch
        the plan's k stays the chain's length (the step's budget counts those rows for the other sequences)."""
        self.context = len(token_ids)
        lone = budget is None or (budget.rows <= 1 and budget.extra == 0)
        n, guess = self.guess(token_ids, room, constraint)
        source, k = self.plan(n, len(guess), budget)
        if source == MODEL and k > 0 and p_min > 0 and lone and self.model == draft_model_method():
            k = room
        k = max(0, min(k, room))
        self._last = (source, n, guess)
        return (lookup_method(), k, guess[:k]) if source == LOOKUP else (self.model, k, None)

    def guess(self, token_ids: list[int], room: int, constraint) -> tuple[int, list[int]]:
        """Prompt lookup's guess: (matched n-gram length, up to `room` tokens the grammar allows)."""
        return self.guesser(token_ids, room, constraint) if self.guesser is not None else (0, [])

    def observe_step(self, num_draft: int, num_accepted: int, emitted: list[int]) -> None:
        """After verifying the step choose_step planned (or a plain step): `observe` with how its guess fared
        against the tokens the target committed."""
        source, n, guess = self._last
        self._last = (MODEL, 0, [])
        # the record counts the guess's tokens that were put to the test, not the whole guess: a guess verified
        # 2 tokens deep (or shadowed by a draft step that committed 2) says nothing of its 3rd..8th tokens, and
        # charging them as rejected kept lookup's α under 0.6 on summaries where nearly every guess held, so the plan
        # kept verifying 1-2 tokens a step (docs/benchmarks/lookup-depth). Its agreement with what the target
        # committed, whichever proposer ran: a verified guess is tested one token past its verified ones too, by the
        # bonus token (the chance a sampled one equals the guess is the chance it would have been accepted), so a
        # guess verified 1 deep still says whether a copy goes on after its first token
        tested = min(len(guess), len(emitted))
        matched = next((j for j, (g, e) in enumerate(zip(guess, emitted)) if g != e), tested)
        self.observe(source, num_draft, num_accepted, n, tested, matched)

    def observe(self, source: str, num_draft: int, num_accepted: int, n: int = 0, lookup_len: int = 0,
                lookup_matched: int = 0) -> None:
        """After verification: what was verified (source, sizes) and how the lookup guess fared: `lookup_len` of
        its tokens were tested (verified, or compared with the committed tokens when it was not verified), the
        first `lookup_matched` of them held."""
        self.lookup_evaluated += 1
        if lookup_len:
            rec = self.by_n.setdefault(self.bucket(n), [0.0, 0.0, 0.0, 0.0])
            held = min(lookup_matched, lookup_len)
            later = min(held + 1, lookup_len) - 1 if held else 0      # tested after the one before held
            # recent guesses count more: a request copies in stretches (an edited function, then new code)
            d = self.lookup_decay
            rec[:] = [d * rec[0] + 1, d * rec[1] + (held > 0), d * rec[2] + later, d * rec[3] + max(held - 1, 0)]
            # the pool's record of lookup (tokens per forward) counts what a verified guess put to the test, not its
            # bonus token's agreement: a lookup step commits its accepted tokens and one more, whatever the guess said
            verified = source == LOOKUP
            self.lookup_proposed += num_draft if verified else lookup_len
            self.lookup_guesses += 1
            self.lookup_matched += num_accepted if verified else lookup_matched
        self.made += 1 + num_accepted
        proposer = lookup_method() if source == LOOKUP else self.model
        self.spent += self.cost.V(1 + num_draft) + (proposal_cost(proposer, num_draft, self.cost) if num_draft else 0)
        if source == LOOKUP:
            self.lookup_steps += 1
        elif num_draft:
            self.drafted += num_draft
            self.accepted += num_accepted
            self.steps += 1
            self.steps_by_k[num_draft] = self.steps_by_k.get(num_draft, 0) + 1
            # once per step, not per read of α (a bisection over every draft length seen, read 2-4 times a step)
            self.own_alpha = steps_alpha(self.steps + self.accepted, self.steps_by_k)
            if self.explore and self.steps < self.explore_steps:
                return
            k, s = best_k(self.model, self.alpha, self.cost, self.cfg.k_max)
            self.k = k if s >= self.cfg.min_speedup else 0
        if self.fallback is None:
            return
        # judged by what the request's steps gave, lookup's included: a head whose own guesses fail on a summary
        # that prompt lookup copies (EAGLE-3 at α 0.3 beside lookup: 2.9-3.3x served) is worth keeping
        mine = self.made / self.spent
        if self.head and (self.steps >= self.switch_after or (self.steps >= 2 and not self.k)):
            self._maybe_switch(f"{self.model} after {self.lookup_evaluated} steps ({self.steps} its own, α="
                               f"{self.alpha:.2f}): {mine:.2f}x", mine)
        elif not self.head and self.lookup_evaluated >= self.lookup_switch_after:
            self._maybe_switch(f"lookup alone after {self.lookup_evaluated} steps: {mine:.2f}x", mine)

    def _maybe_switch(self, why: str, mine: float) -> None:
        """Move to the draft model when it, at its pool α and with its read of the context so far paid over the
        tokens left, is expected to decode switch_margin times as fast as the request's proposer does (`mine`)."""
        model, alpha = self.fallback
        left = self.max_tokens - (self.context - self.prompt_len)
        if left < self.cfg.min_max_tokens:
            self.fallback = None                          # too little left to pay the read
            return
        k, theirs = best_k(model, alpha, self.cost, self.cfg.k_max)
        theirs = amortized(theirs, prompt_read(self.cost, self.context, left)) if k else 1.0
        if theirs <= max(mine, 1.0) * self.switch_margin:
            return
        self.switched = f"{why}; {model} α={alpha:.2f} -> {theirs:.2f}x: moved to {model}"
        if self.head:
            self.retired.append((self.model, self.drafted, self.accepted, self.steps))
        self.model, self.k, self.prior_alpha, self.fallback = model, k, alpha, None
        self.drafted = self.accepted = self.steps = 0
        self.steps_by_k = {}
        self.explore = False              # what the pool lacked of the head it has now; the draft runs on its merits
