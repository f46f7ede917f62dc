"""`auto` with prompt lookup's record read from prompts of the request's size (pools.size_class) and the pair started
at once where the draft is expected 1.1x the matches alone (PolicyConfig.pair_margin), "after", against one record
for every prompt and the matches first wherever they pay ("before"), beside speculation off and the fixed draft
(k = 4), as policy_ab.py runs them.

    python docs/benchmarks/auto-vs-fixed/size_ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import math
import sys

from policy_ab import main, request

from specdec.policy import PolicyConfig, pools

VARIANTS = ["none", "draft", "auto-before", "auto-after"]
SIZE_CLASS = pools.size_class
PAIR_MARGIN = PolicyConfig().pair_margin


def run(llm, ids, variant, params, salt):
    # "before": every prompt in one size class, so the pool keeps one record for all of them, and the matches first
    # wherever they pay, as it was
    before = variant == "auto-before"
    pools.size_class = (lambda n: 0) if before else SIZE_CLASS
    llm.policy().cfg.pair_margin = math.inf if before else PAIR_MARGIN
    try:
        return request(llm, ids, variant, params, salt)
    finally:
        pools.size_class = SIZE_CLASS
        llm.policy().cfg.pair_margin = PAIR_MARGIN


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3] if len(sys.argv) > 3 else "builtin",
         VARIANTS, run, [("auto-after", "auto-before"), ("auto-after", "draft")])
