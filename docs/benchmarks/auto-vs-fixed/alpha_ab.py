"""A request's α from its steps each at its own k (StepController, "after") against one k for their mean ("before":
the mean's rounding moved α by 0.05-0.09 from one step to the next and k with it), for auto and for hybrid (the draft
and the longest match per step, from the first step), beside speculation off and the fixed draft (k = 4), as
policy_ab.py runs them.

    python docs/benchmarks/auto-vs-fixed/alpha_ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import sys

from policy_ab import main, request

from specdec.policy import decide, pools

VARIANTS = ["none", "draft", "hybrid-before", "hybrid-after", "auto-before", "auto-after"]


class MeanK(pools.StepController):
    """The controller as it was: its draft steps' α at the rounded mean of their draft lengths."""

    @property
    def alpha(self) -> float:
        if not self.steps:
            return self.prior_alpha
        own = decide.effective_alpha(1 + self.accepted / self.steps, max(1, round(self.drafted / self.steps)))
        w = self.prior_steps
        return (self.prior_alpha * w + own * self.steps) / (w + self.steps)


def run(llm, ids, variant, params, salt):
    return request(llm, ids, variant, params, salt, MeanK if variant.endswith("before") else None)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3] if len(sys.argv) > 3 else "builtin",
         VARIANTS, run, [("hybrid-after", "hybrid-before"), ("auto-after", "auto-before")])
