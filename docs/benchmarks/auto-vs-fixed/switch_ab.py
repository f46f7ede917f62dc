"""`auto` whose lookup-alone requests may move to the draft after 4 of their steps ("after") against after 8 (as
shipped, StepController.lookup_switch_after; "before"), beside speculation off and the fixed draft (k = 4), as
policy_ab.py runs them. Tried, not kept (docs/benchmarks/auto-vs-fixed/README.md).

    python docs/benchmarks/auto-vs-fixed/switch_ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import sys

from policy_ab import main, request

from specdec.policy import pools

VARIANTS = ["none", "draft", "auto-before", "auto-after"]


class Early(pools.StepController):
    lookup_switch_after = 4


def run(llm, ids, variant, params, salt):
    return request(llm, ids, variant, params, salt, Early if variant == "auto-after" else None)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3] if len(sys.argv) > 3 else "builtin",
         VARIANTS, run, [("auto-after", "auto-before"), ("auto-after", "draft")])
