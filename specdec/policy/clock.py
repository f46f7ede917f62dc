"""How long the target's steps take now, against the cost model measured once per machine.

The cost model prices a verification row against a plain step as they stood when it was measured (at the first
start, then read from the cache). On a shared 2-core host the plain step drifts (1.0-1.8x the measured one within
one session) while the rows past the first do not: a one-row step streams ~1 GB of weights and waits on memory,
which a neighbour's load slows; each further row is multiply-adds on weights already streamed. Measured during
decoding in a slow hour (docs/benchmarks/step-clock): plain steps 29-32 ms against the 23 ms the cached model held,
V(5) 1.42 against its 1.68. Priced as measured, rows looked dearer than they were, and `auto` picked shorter drafts
(or none) than paid.

The clock reads every decode step the engine times: a forward over n rows after `context` tokens, less the
measured seconds of its n − 1 extra rows, is what a plain step takes now. The median over a window of steps,
over the measured plain step, is the ratio `CostModel.slower` re-prices the model by.
"""
from __future__ import annotations

import collections
import statistics

from .cost_model import CostModel

MIN_CHANGE = 0.03        # a ratio within 3% of the one in use: noise, the model in use stays
RATIO_RANGE = (0.5, 3.0)     # beyond these the step measured something else (a stall, a swap): not a drift


class StepClock:
    def __init__(self, measured: CostModel, window: int = 64, every: int = 16):
        self.measured = measured
        self.window = window
        self.every = every                   # re-estimate after this many steps
        self.ratios: collections.deque[float] = collections.deque(maxlen=window)   # each step's plain / measured
        self.ratio = 1.0                     # the one the model in use was re-priced by
        self.steps = 0

    def observe(self, rows: int, context: int, seconds: float) -> CostModel | None:
        """A decode step's forward: `rows` rows after `context` tokens in `seconds`. Returns the re-priced cost
        model when the plain step's median over the window moved by more than MIN_CHANGE, else None."""
        ref = self.measured.at(context)
        if not ref.target_step_s or rows < 1 or seconds <= 0:
            return None
        plain = seconds - ref.target_step_s * (ref.V(rows) - 1.0)
        ratio = plain / ref.target_step_s
        if not RATIO_RANGE[0] <= ratio <= RATIO_RANGE[1]:
            return None
        self.ratios.append(ratio)
        self.steps += 1
        if len(self.ratios) < self.window // 2 or self.steps % self.every:
            return None
        now = statistics.median(self.ratios)
        if abs(now / self.ratio - 1.0) <= MIN_CHANGE:
            return None
        self.ratio = now
        return self.measured.slower(now)

    def status(self) -> dict:
        return {"plain_step_ratio": round(self.ratio, 4), "steps_timed": self.steps,
                "plain_step_s": self.measured.target_step_s * self.ratio}
