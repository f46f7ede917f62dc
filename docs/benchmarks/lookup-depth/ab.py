"""`auto` with prompt lookup's record as it was (every guess charged for all its tokens) and as it is (charged
for the tokens put to the test), beside speculation off, fixed prompt lookup and the fixed draft, in one `LLM`,
interleaved: each prompt runs every variant (the order rotated per prompt) before the next prompt, ROUNDS times.
The two auto variants keep separate pools, so each learns only from its own requests, and every (variant, round)
its own suffix pools (`cache_salt`): suffix decoding sees the answers a server running that variant would have
given before, never another variant's answer to the same prompt. Greedy, 128 tokens, the shipped heads loaded as
`specdec serve` loads them, each request started on an idle machine.

    python docs/benchmarks/lookup-depth/ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import sys
from pathlib import Path

from specdec import LLM, SamplingParams
from specdec.bench.datasets import load_prompts
from specdec.bench.interleaved import interleave, ratio_table, same_text, save, speed_tables
from specdec.config import SpeculativeConfig
from specdec.policy.decide import LOOKUP, MODEL

# "after": the controller as this page's change left it (one α a guess), kept by continuation_ab.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "auto-vs-fixed"))
from continuation_ab import OneAlpha as After  # noqa: E402
from policy_ab import request  # noqa: E402


class Before(After):
    """Every guess charged for all its tokens, whatever was put to the test."""

    def observe_step(self, num_draft, num_accepted, emitted):
        source, n, guess = self._last
        self._last = (MODEL, 0, [])
        if source == LOOKUP:
            matched = num_accepted
        else:
            matched = next((j for j, (g, e) in enumerate(zip(guess, emitted)) if g != e),
                           min(len(guess), len(emitted)))
        self.observe(source, num_draft, num_accepted, n, len(guess), matched)

    def lookup_acceptance(self, n):
        return self.one_alpha(n, self.offered)      # before any prior: as deep as the guess offered


VARIANTS = ["none", "ngram", "draft", "auto-before", "auto-after"]


ARMS = {"auto-before": Before, "auto-after": After}


def run(llm, ids, variant, params, salt="warm"):
    return request(llm, ids, variant, params, salt, ARMS.get(variant))


def main(out_dir: str, rounds: int, source: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = load_prompts(source)
    llm = LLM(speculative=SpeculativeConfig(method="auto"), enable_prefix_caching=False, progress=False)
    llm.policy()
    ids = [llm.encode(p["messages"]) for p in prompts]
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for v in ("none", "ngram", "draft"):
        run(llm, ids[0], v, warm)
    params = SamplingParams(max_tokens=128, temperature=0.0)
    rows = interleave(prompts, ids, VARIANTS, rounds, lambda pid, v, salt: run(llm, pid, v, params, salt))
    save(out, {"source": source, "rounds": rounds, "rows": rows}, report(rows))


def table(rows, key, better) -> list[str]:
    """Median over requests of `better(variant's key, speculation off's key)` (same prompt, same round)."""
    return ratio_table(rows, VARIANTS, key, better,
                       [("after / before", lambda s: s["auto-after"] / s["auto-before"]),
                        ("after / best fixed", lambda s: s["auto-after"] / max(s["ngram"], s["draft"]))])


def report(rows) -> str:
    same, others = same_text(rows)
    out = speed_tables(rows, table, e2e_note=": a draft's prompt read counts wherever it is paid")
    out += ["", f"Text identical to speculation off: {same} of {others}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2,
         sys.argv[3] if len(sys.argv) > 3 else "builtin,long:8")
