"""The cost model's draft step c as `specdec serve` measures it (policy/measure.py), timed as one lone step after the
target's forwards of each round (DRAFT_CHAIN = 1, revision 22) and as the mean of a chain of four (revision 23), the
two in alternation in one process; the drafts load as `specdec serve` loads them.

    python docs/benchmarks/draft-bits/measure_chain.py [PAIRS]
"""
import sys

import torch

from specdec.models.loader import load_model
from specdec.policy import measure
from specdec.proposers.draft_vocab import draft_output_ids

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
torch.set_num_threads(2)
pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
target = load_model(TARGET, quantization="int4", progress=False).model
draft = load_model(DRAFT, quantization="int4", progress=False, int4_exact=False,
                   output_ids=draft_output_ids(TARGET, 32768, 151665)).model
for i in range(pairs):
    for chain in ((1, 4) if i % 2 == 0 else (4, 1)):
        measure.DRAFT_CHAIN = chain
        cm = measure.measure_cost_model(target, draft, None, 8)
        print(f"chain {chain}: c@256 {cm.draft_step:.3f} (target step {cm.target_step_s * 1e3:.1f} ms); " + "; ".join(
            f"c@{b['context']} {b['draft_step']:.3f} ({b['target_step_s'] * 1e3:.1f} ms)" for b in cm.by_context),
            flush=True)
