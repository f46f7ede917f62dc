"""The draft model's chain stopped after a token it gave less than p_min ("after": SpeculativeConfig.draft_p_min, its
default 0.75; a lone auto request's chain may then run to the room, 8) against chains of the planned k ("before":
draft_p_min 0), for the fixed draft (k = 4) and auto, beside speculation off, as policy_ab.py runs them (one `LLM`,
every variant of a prompt before the next prompt, rotated, each request on an idle machine, greedy, 128 tokens).

    python docs/benchmarks/draft-confidence/ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "auto-vs-fixed"))

from policy_ab import main, request  # noqa: E402

from specdec.config import DEFAULT_DRAFT_P_MIN, SpeculativeConfig  # noqa: E402

VARIANTS = ["none", "draft-before", "draft-after", "auto-before", "auto-after"]


def run(llm, ids, variant, params, salt):
    kind, _, arm = variant.partition("-")
    p_min = DEFAULT_DRAFT_P_MIN if arm == "after" else 0.0
    if kind == "auto":
        spec, pool = SpeculativeConfig(method="auto", draft_p_min=p_min), variant
    elif kind == "draft":
        spec, pool = SpeculativeConfig(method="draft", num_speculative_tokens=4, draft_p_min=p_min), "default"
    else:
        spec, pool = SpeculativeConfig(method=kind), "default"
    return request(llm, ids, variant, params, salt, spec=spec, pool=pool)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3] if len(sys.argv) > 3 else "builtin",
         VARIANTS, run, [("draft-after", "draft-before"), ("auto-after", "auto-before")])
