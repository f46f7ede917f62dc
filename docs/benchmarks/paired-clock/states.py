"""How the target's forwards over 1, 3 and 5 rows and the draft's step move together as a shared machine changes
state: the four timed back to back in rounds (the target's rows after 256 tokens of context, the draft's step after
256 of its own, as the cost model is measured), the medians of each 10 rounds printed with their ratios.

    python docs/benchmarks/paired-clock/states.py [ROUNDS]
"""
import statistics
import sys
import time

import torch

from specdec import LLM
from specdec.config import SpeculativeConfig
from specdec.policy.measure import rounds_by_context


def main(rounds: int) -> None:
    llm = LLM(speculative=SpeculativeConfig(method="draft"), enable_prefix_caching=False, progress=False)
    target, draft = llm.target.model, llm.draft.model
    t0 = time.time()
    with torch.inference_mode():
        for _ in range(rounds // 10):       # each call primes both caches, then times 10 rounds
            rows = rounds_by_context(target, [1, 3, 5], [256], 10, draft)[256]
            ms = {k: 1000 * statistics.median(r[k] for r in rows) for k in (1, 3, 5, "draft_step")}
            print(f"{time.time() - t0:6.1f} s  t1 {ms[1]:5.1f}  t3 {ms[3]:5.1f}  t5 {ms[5]:5.1f}  draft "
                  f"{ms['draft_step']:5.2f} ms  V(3) {ms[3] / ms[1]:.2f}  V(5) {ms[5] / ms[1]:.2f}  c "
                  f"{ms['draft_step'] / ms[1]:.3f}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400)
