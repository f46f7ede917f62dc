"""The cut head alone against the whole head for sequences in another script (draft_model.WHOLE_HEAD_SHARE), in one
process, alternating per prompt and round: the built-in open-ended and summarize prompts (one of each in Chinese),
speculation off and the draft at k = 1, 2, 4, greedy, 128 tokens. Prints decode tok/s per round and the mean accepted
length (greedy: the same every round, up to the draft cache's rounding).

    .venv/bin/python docs/benchmarks/draft-vocab/whole_head_ab.py [ROUNDS]
"""
from __future__ import annotations

import statistics
import sys

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.bench.prompts import BUILTIN_PROMPTS
from specdec.proposers import draft_model


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    llm = LLM(speculative=SpeculativeConfig(method="draft"))
    prompts = [p for p in BUILTIN_PROMPTS if p["category"] in ("open-ended", "summarize")]
    params = SamplingParams(max_tokens=128, temperature=0)
    share = draft_model.WHOLE_HEAD_SHARE
    specs = [("off", "none")] + [(f"draft k={k}", SpeculativeConfig(method="draft", num_speculative_tokens=k))
                                 for k in (1, 2, 4)]
    runs: dict[tuple, list] = {}
    for r in range(rounds):
        for i, p in enumerate(prompts):
            for variant in ("cut", "whole") if r % 2 == 0 else ("whole", "cut"):
                draft_model.WHOLE_HEAD_SHARE = float("inf") if variant == "cut" else share
                for name, spec in specs:
                    if name == "off" and variant == "whole":
                        continue
                    st = llm.generate(p["messages"], params, spec=spec)[0].stats
                    key = (i, "-" if name == "off" else variant, name)
                    runs.setdefault(key, []).append((st.decode_tok_s, st.mean_accepted_length))
    print("| prompt | head | method | decode tok/s per round | median over off's | accepted length |")
    print("|---|---|---|---|---|---|")
    for (i, variant, name), xs in sorted(runs.items()):
        off = [x[0] for x in runs[(i, "-", "off")]]
        ratio = statistics.median(x[0] / o for x, o in zip(xs, off))
        text = prompts[i]["messages"][0]["content"][:14].replace("|", " ")
        mal = f"{xs[0][1]:.2f}" if xs[0][1] else "-"
        print(f"| {prompts[i]['category']} `{text}` | {variant} | {name} | {' / '.join(f'{x[0]:.1f}' for x in xs)} "
              f"| {ratio:.2f}x | {mal} |")

if __name__ == "__main__":
    main()
