"""auto's per-step choices on built-in prompts of some categories, one fresh `LLM`: every plan of the step controller
(proposer, k, the lookup match length n and guess length L, each side's α -- a guess's first token's, and its later
tokens' -- and expected gain alone in a step) and how it fared (tokens verified, accepted, and how many of the guess
held).

    python docs/benchmarks/lookup-depth/trace.py CATEGORIES [METHODS] [ROUNDS] [-v]
    python docs/benchmarks/lookup-depth/trace.py summarize ngram,draft,auto 1 -v
"""
import json
import sys
import time

from specdec import LLM, SamplingParams
from specdec.bench.prompts import BUILTIN_PROMPTS
from specdec.config import SpeculativeConfig
from specdec.policy.cost_model import StepBudget
from specdec.policy.decide import StepController
from specdec.proposers.registry import lookup_method

LOG: list[dict] = []
_plan, _observe = StepController.plan, StepController.observe


def plan(self, n, lookup_len, budget=None):
    alone = StepBudget(self.cost)
    kd, gd = alone.best(self.model, self.alpha, self.k) if self.k else (0, 1.0)
    a = rest = kl = gl = None
    if lookup_len and self.use_lookup:
        a, rest = self.lookup_acceptance(n)
        kl, gl = alone.best(lookup_method(), a, lookup_len, rest)
    source, k = _plan(self, n, lookup_len, budget)
    LOG.append({"t_ms": round(time.perf_counter() * 1000, 1), "src": source, "k": k, "n": n, "L": lookup_len,
                "alpha_d": round(self.alpha, 3), "kd": kd, "gd": round(gd, 3),
                "alpha_l": a if a is None else round(a, 3), "rest_l": rest if rest is None else round(rest, 3),
                "kl": kl, "gl": gl if gl is None else round(gl, 3)})
    return source, k


def observe(self, source, num_draft, num_accepted, n=0, lookup_len=0, lookup_matched=0):
    if LOG:
        LOG[-1].update(verified=num_draft, accepted=num_accepted, guess_tested=lookup_len, guess_held=lookup_matched)
    return _observe(self, source, num_draft, num_accepted, n, lookup_len, lookup_matched)


def main(cats: list[str], methods: list[str], rounds: int, verbose: bool) -> None:
    StepController.plan, StepController.observe = plan, observe
    llm = LLM(enable_prefix_caching=False, progress=False, speculative=SpeculativeConfig(method="auto"))
    llm.policy()
    prompts = [p for p in BUILTIN_PROMPTS if p["category"] in cats]
    ids = [llm.encode(p["messages"]) for p in prompts]
    for m in methods:
        llm.generate(ids[0], SamplingParams(max_tokens=4, temperature=0.0), spec=SpeculativeConfig(method=m))
    params = SamplingParams(max_tokens=128, temperature=0.0)
    for rnd in range(rounds):
        for i, p in enumerate(ids):
            for m in methods:
                LOG.clear()
                out = llm.generate(p, params, spec=SpeculativeConfig(method=m), cache_salt=f"{m}-{rnd}")[0]
                st, n = out.stats, len(out.token_ids)
                sources = {}
                for e in LOG:
                    sources[e["src"]] = sources.get(e["src"], 0) + 1
                print(f"# round {rnd + 1} prompt {i} {prompts[i]['category']} {m}: {n} tokens, TTFT {st.ttft_s:.2f} s, "
                      f"decode {(n - 1) / (st.e2e_s - st.ttft_s):.1f} tok/s, steps {sources} | {st.method} "
                      f"k={st.num_speculative_tokens} | {st.policy_reason}", flush=True)
                if verbose and m == "auto":
                    for e in LOG:
                        print(json.dumps(e))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "-v"]
    main(args[0].split(","), args[1].split(",") if len(args) > 1 else ["auto"],
         int(args[2]) if len(args) > 2 else 1, "-v" in sys.argv)
