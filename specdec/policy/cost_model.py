"""The cost model of one speculative step, in units of one plain target step.

With acceptance rate α (each draft token accepted independently with probability α) and k drafts, one target
forward commits on average E(α, k) = (1 − α^(k+1)) / (1 − α) tokens (Leviathan et al. 2023, eq. 1). The step
costs k·c (k draft steps, c = draft step / target step) plus V(k+1) (a target forward over k+1 tokens, relative
to one over a single token), so the expected speedup over plain decoding is

    S_draft(α, k) = E(α, k) / (k·c + V(k+1)),      S_ngram(α, k) = E(α, k) / (V(k+1) + lookup)

A learned head (eagle3, medusa) costs h1 for its first draft token (feeding the target's newest states, one layer
and an output head) and h for each further one: S_head(α, k) = E(α, k) / (h1 + (k−1)·h + V(k+1)); Medusa's heads
guess every position at once (h ≈ 0).

Both c and V(n) are measured on the machine (see `measure.py`) at a short context and at longer ones (buckets up to
4k tokens or the model's window): attention over the context is paid per row, so a verification row and a draft
step cost more, relative to a plain step, as the context grows (`at(context)` interpolates between the buckets).
This file is pure arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config import PLAIN
from ..proposers.registry import METHOD_TABLE


def expected_tokens(alpha: float, k: int, rest: float | None = None) -> float:
    """Mean tokens committed per target forward (accepted drafts + the recovered or bonus token). With `rest`, the
    first draft holds with probability α and each later one, once the one before it held, with probability `rest`:
    1 + α·E(rest, k − 1) (a copied span: its first token is the bet, the ones after it mostly follow)."""
    if k <= 0:
        return 1.0
    alpha = min(max(alpha, 0.0), 1.0)
    if rest is not None:
        return 1.0 + alpha * expected_tokens(rest, k - 1)
    if alpha >= 1.0 - 1e-9:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def row_scale(points: list[tuple[int, float]] | None, n: int) -> float:
    """s(n) from [(n, s)] ascending: linear between the points, the nearest one's past either end; 1 without any."""
    if not points:
        return 1.0
    if n <= points[0][0]:
        return points[0][1]
    for (n0, s0), (n1, s1) in zip(points, points[1:]):
        if n <= n1:
            return s0 + (s1 - s0) * (n - n0) / (n1 - n0)
    return points[-1][1]


@dataclass
class CostModel:
    draft_step: float                    # c: one draft forward (one token) / one target forward (one token)
    verify: list[float] = field(default_factory=lambda: [1.0])   # V(n) for n = 1..len; V(1) = 1 by definition
    # V at larger row counts, [[n, V(n)], ...] ascending past len(verify): a batched step carries up to
    # max_num_seqs x (k_max + 1) rows; between points V is interpolated linearly
    verify_large: list = field(default_factory=list)
    lookup: float = 0.0                  # n-gram lookup per step, relative to a target step
    target_step_s: float = 0.0           # seconds of one plain target step (for net-speedup accounting)
    source: str = "measured"             # where the numbers came from
    heads: dict = field(default_factory=dict)   # learned head method -> [h1, h]: its first / each further draft token
    context: int = 256                   # the context the figures above were measured at
    # the same figures at longer contexts, ascending, each relative to a plain step at its context:
    # [{"context": n, "verify": [V(1..)], "draft_step": c, "target_step_s": s}, ...]
    by_context: list = field(default_factory=list)
    # seconds per prompt token for the draft model to read a prompt (it does so while the target prefills, so a
    # long prompt's first token comes later by about this much per token when the draft is chosen)
    draft_prefill_s: float = 0.0
    # the same per prompt length, [[tokens, seconds per token], ...] ascending (read in the engine's chunks): a
    # token's attention grows with the tokens before it, so a 2k prompt costs more per token than a 512 one
    draft_read: list = field(default_factory=list)
    _by_context: dict = field(default_factory=dict, repr=False, compare=False)   # at()'s results, per 64 tokens

    def __post_init__(self):
        # a forward over more tokens never costs less than over fewer: measurement noise (and row padding that
        # makes 1..6 tokens cost the same) must not make verification look cheaper than a plain step
        v = [1.0]
        for x in self.verify[1:]:
            v.append(max(x, v[-1]))
        self.verify = v
        large = []
        for n, x in sorted((int(n), float(x)) for n, x in self.verify_large if int(n) > len(v)):
            large.append([n, max(x, large[-1][1] if large else v[-1])])
        self.verify_large = large
        self.by_context = sorted((b for b in self.by_context if int(b["context"]) > self.context and
                                  len(b.get("verify", [])) >= 2), key=lambda b: int(b["context"]))

    def V(self, n: int) -> float:
        """Target forward over n tokens relative to one token; between measured points interpolate, past the last
        extrapolate linearly."""
        if n <= len(self.verify):
            return self.verify[max(n, 1) - 1]
        pts = [(len(self.verify) - 1, self.verify[-2] if len(self.verify) >= 2 else self.verify[-1]),
               (len(self.verify), self.verify[-1])] + [(m, x) for m, x in self.verify_large]
        for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
            if n <= n1 and n1 > n0:
                return v0 + (v1 - v0) * (n - n0) / (n1 - n0)
        (n0, v0), (n1, v1) = pts[-2], pts[-1]
        slope = max(0.0, (v1 - v0) / (n1 - n0)) if n1 > n0 else 0.0
        return v1 + slope * (n - n1)

    def to_dict(self) -> dict:
        """As JSON holds it: no draft model (draft_step infinite) is null, so the status endpoint and the cached
        file stay standard JSON."""
        return {"draft_step": _finite_or_none(self.draft_step), "verify": list(self.verify),
                "verify_large": self.verify_large, "lookup": self.lookup, "target_step_s": self.target_step_s,
                "source": self.source, "heads": {m: list(c) for m, c in self.heads.items()}, "context": self.context,
                "by_context": [{**b, "draft_step": _finite_or_none(b["draft_step"])} for b in self.by_context],
                "draft_prefill_s": self.draft_prefill_s, "draft_read": self.draft_read}

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        return cls(_step(d["draft_step"]), [float(v) for v in d["verify"]], d.get("verify_large", []),
                   float(d.get("lookup", 0.0)), float(d.get("target_step_s", 0.0)), d.get("source", "cache"),
                   {m: [float(x) for x in c] for m, c in d.get("heads", {}).items()}, int(d.get("context", 256)),
                   [{"context": int(b["context"]), "verify": [float(v) for v in b["verify"]],
                     "draft_step": _step(b.get("draft_step", 0.0)), "target_step_s": float(b.get("target_step_s", 0.0))}
                    for b in d.get("by_context", [])],
                   float(d.get("draft_prefill_s", 0.0)),
                   [[int(n), float(x)] for n, x in d.get("draft_read", [])])

    def slower(self, ratio: float, rows: list[tuple[int, float]] | None = None, draft: float = 1.0) -> CostModel:
        """This model on the machine as it runs now, its plain step `ratio` times as long as when measured (a
        one-row step streams the weights from memory, and a neighbour's load or the machine's drift moves it by
        up to 1.8x within a session on a shared host) while the rows past the first take their measured seconds
        times a scale s(n): V(n) = 1 + s(n)·(V(n) − 1) / ratio. `rows`, [(n, s)] ascending, are the scales the
        engine's own steps of n rows showed (policy/clock.py), interpolated between and held past the ends; without
        them s = 1 (the rows past the first cost the seconds they did). A lookup's or a head's time (CPU work on
        small data) shrinks like the rows in step units. The draft's step is a one-row stream too: c stays, times
        `draft` where the draft's own steps were timed (its step now over its measured one, over `ratio`)."""
        if ratio == 1.0 and not rows and draft == 1.0:
            return self

        def scaled(n: int, x: float) -> float:
            return 1.0 + row_scale(rows, n) * (x - 1.0) / ratio

        def verify(v: list[float]) -> list[float]:
            return [scaled(n, x) for n, x in enumerate(v, 1)]
        return CostModel(self.draft_step * draft, verify(self.verify),
                         [[n, scaled(n, x)] for n, x in self.verify_large], self.lookup / ratio,
                         self.target_step_s * ratio, self.source,
                         {m: [x / ratio for x in c] for m, c in self.heads.items()}, self.context,
                         [{**b, "verify": verify(b["verify"]), "target_step_s": b["target_step_s"] * ratio,
                           "draft_step": b["draft_step"] * draft} for b in self.by_context],
                         self.draft_prefill_s, self.draft_read)

    def contexts(self) -> list[int]:
        """The contexts measured, ascending."""
        return [self.context] + [int(b["context"]) for b in self.by_context]

    def at(self, context: int) -> CostModel:
        """The cost model of a step after `context` tokens: V(n) and c interpolated linearly in the context between
        the two measured contexts around it; past the longest, extrapolated along the last segment up to twice the
        longest (attention grows linearly with the context; further out the line is a guess, so it stops there).
        Below the shortest context, or with nothing measured past it, the model itself."""
        if not self.by_context or context <= self.context:
            return self
        context = -(-context // 64) * 64
        if context not in self._by_context:
            self._by_context[context] = self._at(context)
        return self._by_context[context]

    def _at(self, context: int) -> CostModel:
        pts = [{"context": self.context, "verify": self.verify, "draft_step": self.draft_step,
                "target_step_s": self.target_step_s}] + self.by_context
        context = min(context, 2 * pts[-1]["context"])
        i = next((i for i in range(1, len(pts)) if context <= pts[i]["context"]), len(pts) - 1)
        a, b = pts[i - 1], pts[i]
        w = (context - a["context"]) / (b["context"] - a["context"])
        n = min(len(a["verify"]), len(b["verify"]))

        def mix(x: float, y: float) -> float:
            return x + (y - x) * w
        verify = [mix(x, y) for x, y in zip(a["verify"][:n], b["verify"][:n])]
        # past the rows measured at both, the short context's growth per row on top of the last point
        verify += [verify[-1] + x - self.verify[n - 1] for x in self.verify[n:]]
        scale = verify[-1] / self.verify[-1]          # the rows measured past verify grow as its last one did
        large = [[m, x * scale] for m, x in self.verify_large]
        ca, cb = a["draft_step"], b["draft_step"]
        draft = mix(ca, cb) if ca and cb and math.isfinite(ca) and math.isfinite(cb) else self.draft_step
        sa, sb = a["target_step_s"], b["target_step_s"]
        step_s = mix(sa, sb) if sa and sb else self.target_step_s
        return CostModel(draft, verify, large, self.lookup, step_s, self.source, dict(self.heads), context,
                         draft_prefill_s=self.draft_prefill_s, draft_read=self.draft_read)


def read_cost_file(path, key: str, revision: int) -> CostModel | None:
    """The cost model a cache file holds for `key` at `revision`; None when there is none, it is unreadable or
    damaged, or it was measured by another version or for another setup (then it is measured again)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        if not isinstance(saved, dict) or saved.get("revision") != revision or saved.get("key") != key:
            return None
        cost = CostModel.from_dict(saved)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):    # none, or damaged
        return None
    sane = (len(cost.verify) >= 2 and all(math.isfinite(v) for v in [*cost.verify, cost.target_step_s])
            and not math.isnan(cost.draft_step))                               # inf: measured without a draft model
    return cost if sane else None


def read_seconds(cost: CostModel, tokens: int) -> float:
    """Seconds for the draft model to read a `tokens`-token prompt: its per-token time interpolated linearly in the
    length between the lengths measured (draft_read), extrapolated along the last segment up to twice the longest (as
    CostModel.at does for steps); draft_prefill_s a token where only that was measured."""
    pts = cost.draft_read
    if len(pts) < 2:
        return tokens * (pts[0][1] if pts else cost.draft_prefill_s)
    n = min(max(tokens, pts[0][0]), 2 * pts[-1][0])
    i = next((i for i in range(1, len(pts)) if n <= pts[i][0]), len(pts) - 1)
    (na, ra), (nb, rb) = pts[i - 1], pts[i]
    return tokens * (ra + (rb - ra) * (n - na) / (nb - na))


def prompt_read(cost: CostModel, context: int, max_tokens: int) -> float:
    """A draft model's read of a `context`-token prompt (read_seconds, paid once before it first drafts), as a share
    of the plain decode of `max_tokens` tokens (0 where either cost is unknown)."""
    if not (cost.draft_prefill_s or cost.draft_read) or not cost.target_step_s or max_tokens <= 0:
        return 0.0
    return read_seconds(cost, context) / (max_tokens * cost.target_step_s)


def amortized(speedup: float, read: float) -> float:
    """The speedup over a whole request of a proposer that decodes `speedup`x plain per step after a one-off read
    costing `read` of the plain decode's time (prompt_read)."""
    return 1.0 / (1.0 / speedup + read)


def prices(method: str, cost: CostModel) -> bool:
    """Whether the cost model has a price for the method's proposals (a head's is measured per head)."""
    m = METHOD_TABLE.get(method)
    return m is not None and (m.kind != "head" or method in cost.heads)


def proposal_cost(method: str, k: int, cost: CostModel) -> float:
    """Time spent proposing k tokens, in target-step units: k draft steps, one lookup (prompt or suffix), or a
    head's steps."""
    m = METHOD_TABLE.get(method)
    kind = m.kind if m is not None else None
    if kind == "model":
        return k * cost.draft_step
    if m is not None and m.free:          # a search of token arrays: priced like prompt lookup
        return cost.lookup
    if kind == "head" and method in cost.heads:
        first, further = cost.heads[method]
        return first + max(k - 1, 0) * further if k > 0 else 0.0
    raise ValueError(f"no cost model for method '{method}'")


def expected_speedup(method: str, alpha: float, k: int, cost: CostModel) -> float:
    """S(α, k) for a method that proposes (1.0 for plain decoding or k = 0)."""
    if method == PLAIN or k <= 0:
        return 1.0
    return expected_tokens(alpha, k) / (cost.V(k + 1) + proposal_cost(method, k, cost))


def best_k(method: str, alpha: float, cost: CostModel, k_max: int) -> tuple[int, float]:
    """The k in 1..k_max with the highest expected speedup (ties go to the smaller k)."""
    return _best(lambda k: expected_speedup(method, alpha, k, cost), k_max)


def _best(score, k_max: int) -> tuple[int, float]:
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        s = score(k)
        if s > best[1] + 1e-9:
            best = (k, s)
    return best


@dataclass
class StepBudget:
    """What one batched step already carries, to price another sequence's draft in it.

    All sequences of a step share its time, so the sum of their decode speeds is the step's expected tokens over
    its time: adding k draft rows for one sequence pays when (tokens + E(α, k) − 1) / (V(rows + k) + extra + k·c)
    beats the step without them. With one sequence (rows = tokens = 1, extra = 0) this is S(α, k) above; as rows
    stop being free (V grows with the batch), the best k falls toward 0.
    """
    cost: CostModel
    rows: int = 1                 # rows already in the forward (one per decoding sequence, prompt chunks)
    tokens: float = 1.0           # tokens the step is expected to commit
    extra: float = 0.0            # draft / lookup time already spent for this step, in target-step units

    def rate(self, d_tokens: float = 0.0, d_rows: int = 0, d_extra: float = 0.0) -> float:
        return (self.tokens + d_tokens) / (self.cost.V(self.rows + d_rows) + self.extra + d_extra)

    def gain(self, method: str, alpha: float, k: int, rest: float | None = None) -> float:
        """The step's expected rate with this sequence's k drafts, relative to without them (`rest`: as in
        expected_tokens)."""
        if k <= 0:
            return 1.0
        return self.rate(expected_tokens(alpha, k, rest) - 1.0, k, proposal_cost(method, k, self.cost)) / self.rate()

    def best(self, method: str, alpha: float, k_max: int, rest: float | None = None) -> tuple[int, float]:
        """The k in 0..k_max with the highest gain (ties go to the smaller k)."""
        return _best(lambda k: self.gain(method, alpha, k, rest), k_max)

    def add(self, method: str, alpha: float, k: int, rest: float | None = None) -> None:
        if k > 0:
            self.tokens += expected_tokens(alpha, k, rest) - 1.0
            self.rows += k
            self.extra += proposal_cost(method, k, self.cost)


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _step(x) -> float:
    """A draft step as stored: null (no draft model) is infinitely expensive."""
    return float("inf") if x is None else float(x)
