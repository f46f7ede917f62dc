"""How long the target's steps take now, against the cost model measured once per machine.

The cost model prices a verification row against a plain step as they stood when it was measured (at the first
start, then read from the cache). On a shared 2-core host the plain step drifts (1.0-1.8x the measured one within
one session): a one-row step streams ~1 GB of weights and waits on memory, which a neighbour's load slows. The rows
past the first are multiply-adds on weights already streamed, and how their seconds move with the plain step's
differs between hosts: on one Zen 4 host they kept their seconds while the plain step slowed (docs/benchmarks/
step-clock: plain steps 29-32 ms against a measured 23, V(5) 1.42 against 1.68), on another a 5-row step took ~37 ms
whether the plain step took 23 or 31 ms, so V(5) was 1.6 in the fast state where the model measured in a slow one
priced 1.26 (docs/benchmarks/row-clock). Priced as measured, rows looked dearer or cheaper than they were, and
`auto` sized its drafts and trees (or speculated at all) on the wrong side.

The clock reads every decode step the engine times: a forward over n rows after `context` tokens, over the seconds
the measured model gives n rows at that context, is that row count's ratio now. With enough recent one-row steps,
their median ratio re-prices the plain step, and each row count seen often enough its own V(n); the others scale
their measured extra rows like the nearest ones seen (`CostModel.slower`). Without recent one-row steps (every step
speculating), the plain step is what a step took less its n − 1 extra rows at their measured seconds. The draft
model's chains are timed too: its step against its measured one, over the plain step's ratio, re-prices c (in the
fast state above a draft token took 0.31 of a plain step where the model said 0.26).

The machine moves between states within seconds (on one Zen 4 host a one-row step of 23.5 or 33.5 ms, a 5-row one
of 38.5 or 40 ms, the draft's 7.6 or 9.1 ms, switching from one 10-second span to the next), so each step and each
chain is read over the one-row steps of the same moment (within `pair_span` steps), not over a window's median,
which can pair a fast minute's plain steps (another request's) with a slow minute's rows. Where every step
speculates, a lone sequence is asked for a plain step when none was timed for `probe_every` steps
(`wants_plain`): the moment's reference, at a plain step's yield once in ~17 steps.
"""
from __future__ import annotations

import bisect
import collections
import math
import statistics

from .cost_model import CostModel

MIN_CHANGE = 0.03        # every price within 3% of the model in use: noise, the model in use stays
RATIO_RANGE = (0.5, 3.0)     # beyond these the step measured something else (a stall, a swap): not a drift
MIN_EXTRA = 0.02         # a row count measured within 2% of a plain step: its scale is noise over nothing
MAX_SCALE = 5.0          # rows at most 5x their measured extra seconds: beyond, a row count's few steps met a stall
PAIR_SPAN = 24           # a one-row step this many steps either side of a step is of the same moment of the machine


class StepClock:
    def __init__(self, measured: CostModel, window: int = 64, every: int = 16, horizon: int = 0,
                 min_samples: int = 0, probe_every: int = 16, pair_span: int = PAIR_SPAN):
        self.measured = measured
        self.window = window
        self.every = every                   # re-estimate after this many steps
        # steps of one row count older than this many steps are not read: a row count the engine stopped running
        # (every request speculating) must not keep a state of the machine it has left
        self.horizon = horizon or 4 * window
        self.min_samples = min_samples or max(4, window // 8)   # a row count's steps before its median is read
        self.ratios: collections.deque[float] = collections.deque(maxlen=window)   # each step's plain / measured
        self.by_rows: dict[int, collections.deque] = {}   # rows -> (step, seconds / measured seconds of those rows)
        self.drafts: collections.deque = collections.deque(maxlen=window)   # (step, draft step / measured one)
        self.ratio = 1.0                     # the plain step's, in the model in use
        self.scales: list[tuple[int, float]] = []   # the row counts' scales in it (CostModel.slower)
        self.draft = 1.0                     # c's factor in it
        self.current = measured
        self.steps = 0
        # a lone sequence's step is made plain when no one-row step was timed for this many steps (0: never): a
        # server where every step speculates has no plain step of the same moment to price its rows against
        self.probe_every = probe_every
        self.pair_span = pair_span
        self.last_plain = 0                  # the step count at the last one-row step

    def observe(self, rows: int, context: int, seconds: float) -> CostModel | None:
        """A decode step's forward: `rows` rows after `context` tokens in `seconds`. Returns the re-priced cost
        model when a price moved by more than MIN_CHANGE, else None."""
        ref = self.measured.at(context)
        if not ref.target_step_s or rows < 1 or seconds <= 0:
            return None
        plain = seconds - ref.target_step_s * (ref.V(rows) - 1.0)
        ratio = plain / ref.target_step_s
        if not RATIO_RANGE[0] <= ratio <= RATIO_RANGE[1]:
            return None
        self.ratios.append(ratio)
        self.steps += 1
        if rows == 1:
            self.last_plain = self.steps
        if rows <= len(self.measured.verify):
            self.by_rows.setdefault(rows, collections.deque(maxlen=self.window)).append(
                (self.steps, seconds / (ref.target_step_s * ref.V(rows))))
        if len(self.ratios) < self.window // 2 or self.steps % self.every:
            return None
        ratio, scales, draft = self._estimate()
        model = self.measured.slower(ratio, scales, draft)
        if not self._moved(model):
            return None
        self.ratio, self.scales, self.draft, self.current = ratio, scales, draft, model
        return model

    def observe_draft(self, forwards: int, context: int, seconds: float) -> None:
        """The draft model's chain of `forwards` one-row steps after `context` tokens in `seconds`: its step now
        against its measured one; read with the target's steps (the next re-estimate)."""
        ref = self.measured.at(context)
        c = ref.draft_step
        if not ref.target_step_s or not math.isfinite(c) or c <= 0 or forwards < 1 or seconds <= 0:
            return
        ratio = seconds / forwards / (c * ref.target_step_s)
        if RATIO_RANGE[0] <= ratio <= RATIO_RANGE[1]:
            self.drafts.append((self.steps, ratio))

    def wants_plain(self) -> bool:
        """Whether a lone sequence's next step should be plain: no one-row step was timed for `probe_every` steps,
        so the rows and the draft's chains have no plain step of the same moment to be priced against (one step in
        ~17 at a plain step's yield: ~1.5% where drafting doubles the rate; docs/benchmarks/paired-clock)."""
        return self.probe_every > 0 and self.steps - self.last_plain >= self.probe_every

    def _recent(self, rows: int) -> list[tuple[int, float]]:
        # copied first, in one C call: the status endpoint reads this from another thread while the engine appends
        seen = list(self.by_rows.get(rows, ()))
        return [(step, r) for step, r in seen if step > self.steps - self.horizon]

    def _paired(self, samples: list[tuple[int, float]], plain: list[tuple[int, float]]) -> list[float]:
        """Each sample's ratio over the one-row steps' median within `pair_span` steps of it (samples with none that
        near are left out). The machine moves between states within seconds (a one-row step of 23.5 ms or 33.5 ms,
        a 5-row one of 38.5 or 40 ms): a ratio of two row counts' medians over a window may pair one state's rows
        with the other's plain steps."""
        steps = [step for step, _ in plain]
        out = []
        for step, r in samples:
            lo = bisect.bisect_left(steps, step - self.pair_span)
            hi = bisect.bisect_right(steps, step + self.pair_span)
            if hi > lo:
                out.append(r / statistics.median(x for _, x in plain[lo:hi]))
        return out

    def _estimate(self) -> tuple[float, list[tuple[int, float]], float]:
        """(the plain step's ratio, [(n, s(n))], c's factor): from recent one-row steps, and each row count's and the
        draft's own steps each over the one-row steps of the same moment, where there are enough of them; else from
        every step, its extra rows at their measured seconds, s = 1, and the draft's steps over that ratio."""
        plain = self._recent(1)
        drafts = [(step, r) for step, r in list(self.drafts) if step > self.steps - self.horizon]
        if len(plain) < self.min_samples:
            ratio = statistics.median(self.ratios)
            return ratio, [], statistics.median(r for _, r in drafts) / ratio if len(drafts) >= self.min_samples \
                else 1.0
        r1 = statistics.median(r for _, r in plain)
        scales = []
        for n in range(2, len(self.measured.verify) + 1):
            v = self.measured.V(n)
            q = self._over_plain(self._recent(n), plain, r1)
            if q is not None and v - 1.0 >= MIN_EXTRA:
                # V now = V measured · q = 1 + s · (V measured − 1) / r_1
                scales.append((n, min(max((v * q - 1.0) * r1 / (v - 1.0), 0.0), MAX_SCALE)))
        draft = self._over_plain(drafts, plain, r1)
        return r1, scales, 1.0 if draft is None else draft

    def _over_plain(self, samples: list[tuple[int, float]], plain: list[tuple[int, float]], r1: float
                    ) -> float | None:
        """These steps' ratio over the plain step's: the median of their ratios each over the one-row steps of the
        same moment where enough of them have such neighbours; else their median over all recent one-row steps'
        (r1); None with too few."""
        paired = self._paired(samples, plain)
        if len(paired) >= self.min_samples:
            return statistics.median(paired)
        return statistics.median(r for _, r in samples) / r1 if len(samples) >= self.min_samples else None

    def _moved(self, model: CostModel) -> bool:
        """Whether the plain step or any row count's V differs by more than MIN_CHANGE from the model in use."""
        if abs(model.target_step_s / self.current.target_step_s - 1.0) > MIN_CHANGE:
            return True
        if math.isfinite(model.draft_step) and self.current.draft_step > 0 and \
                abs(model.draft_step / self.current.draft_step - 1.0) > MIN_CHANGE:
            return True
        return any(abs(model.V(n) / self.current.V(n) - 1.0) > MIN_CHANGE
                   for n in range(2, len(self.measured.verify) + 1))

    def status(self) -> dict:
        return {"plain_step_ratio": round(self.ratio, 4), "steps_timed": self.steps,
                "plain_step_s": self.measured.target_step_s * self.ratio,
                "row_scales": [[n, round(s, 3)] for n, s in self.scales], "draft_step_scale": round(self.draft, 4),
                "drafts_timed": len(self.drafts),
                "rows_timed": {n: len(self._recent(n)) for n in sorted(dict(self.by_rows))}}
