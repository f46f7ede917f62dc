"""`auto` starting a request on the pair (the draft with lookup beside it) wherever the draft, its read paid, is
expected at least as fast as the matches alone ("after", PolicyConfig.pair_margin 1.0) against only where it is
expected 1.1x as fast ("before", 1.1), beside speculation off and the fixed draft (k = 4), as policy_ab.py runs them.

    python docs/benchmarks/auto-vs-fixed/margin_ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import sys

from policy_ab import main, request

VARIANTS = ["none", "draft", "auto-before", "auto-after"]
MARGINS = {"auto-before": 1.1, "auto-after": 1.0}


def run(llm, ids, variant, params, salt):
    cfg = llm.policy().cfg
    shipped = cfg.pair_margin
    cfg.pair_margin = MARGINS.get(variant, shipped)
    try:
        return request(llm, ids, variant, params, salt)
    finally:
        cfg.pair_margin = shipped


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3] if len(sys.argv) > 3 else "builtin",
         VARIANTS, run, [("auto-after", "auto-before"), ("auto-after", "draft")])
