"""Suffix decoding alone against the draft with the free proposers' guesses beside it (method hybrid: the draft and,
each step, the longest prompt-lookup or suffix match; auto's pair), in one process, interleaved per prompt.

Each variant keeps its own suffix corpus (cache_salt per variant and round): a prompt never meets its own answer.

    python docs/benchmarks/suffix-alone/compare.py ROUNDS [CATEGORIES]
"""
import statistics
import sys

from specdec import LLM, SamplingParams
from specdec.bench.idle import wait_until_idle
from specdec.bench.prompts import BUILTIN_PROMPTS
from specdec.config import SpeculativeConfig

VARIANTS = {"none": SpeculativeConfig(method="none"), "suffix": SpeculativeConfig(method="suffix"),
            "hybrid": SpeculativeConfig(method="hybrid")}


def main(rounds: int, cats: list[str] | None) -> None:
    llm = LLM(enable_prefix_caching=False, progress=False, speculative=SpeculativeConfig(method="auto"))
    prompts = [(p["category"], llm.encode(p["messages"])) for p in BUILTIN_PROMPTS
               if cats is None or p["category"] in cats]
    for spec in VARIANTS.values():                                    # warm every path once
        llm.generate(prompts[0][1], SamplingParams(max_tokens=4, temperature=0.0), spec=spec, cache_salt="warm")
    params = SamplingParams(max_tokens=128, temperature=0.0)
    rows = []
    for r in range(rounds):
        for i, (cat, ids) in enumerate(prompts):
            got = {}
            for name, spec in VARIANTS.items():
                wait_until_idle()
                out = llm.generate(ids, params, spec=spec, cache_salt=f"{name}-{r}")[0]
                st = out.stats
                got[name] = ((len(out.token_ids) - 1) / (st.e2e_s - st.ttft_s), out.token_ids)
            same = all(v[1] == got["none"][1] for v in got.values())
            rows.append((r, i, cat, {k: v[0] for k, v in got.items()}, same))
            print(f"round {r + 1} prompt {i} {cat}: " + ", ".join(f"{k} {v[0]:.1f}" for k, v in got.items())
                  + f" tok/s; identical {same}", flush=True)
    print("\nDecode tok/s over speculation off's, per request (median [min - max]):\n")
    print("| category | requests | suffix alone | hybrid (draft + guesses) | suffix / hybrid |\n|---|---|---|---|---|")
    for cat in [*dict.fromkeys(c for _, _, c, _, _ in rows), "all"]:
        mine = [x for x in rows if cat in ("all", x[2])]
        s = [x[3]["suffix"] / x[3]["none"] for x in mine]
        h = [x[3]["hybrid"] / x[3]["none"] for x in mine]
        q = [a / b for a, b in zip(s, h)]
        fmt = lambda v: f"{statistics.median(v):.2f}x [{min(v):.2f} - {max(v):.2f}]"  # noqa: E731
        print(f"| {cat} | {len(mine)} | {fmt(s)} | {fmt(h)} | {statistics.median(q):.2f} "
              f"(below 1: {sum(x < 1 for x in q)}/{len(q)}) |")
    print(f"\nText identical to speculation off's: {sum(x[4] for x in rows)} of {len(rows)}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2].split(",") if len(sys.argv) > 2 else None)
