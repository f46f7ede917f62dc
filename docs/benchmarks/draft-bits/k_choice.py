"""Does a constant-alpha cost model choose k well for the draft? From the same teacher-forced greedy matches as
acceptance.py (the 4-bit draft, 26 prompts): per prompt, the tokens a step commits at each k = 1..8 as they happened
(runs of matches), the k the model E(alpha, k) / (k c + V(k + 1)) picks with alpha fitted to the request's own k = 4
steps (decide.effective_alpha, what the step controller does), and the k that was best, both priced with c = 0.29 and
this machine's V(n) at 1k tokens (its cost model); the loss is the chosen k's speed over the best k's.

    python docs/benchmarks/draft-bits/k_choice.py
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import acceptance  # noqa: E402

from specdec.policy.cost_model import expected_tokens  # noqa: E402
from specdec.policy.decide import effective_alpha  # noqa: E402

C, V = 0.29, [1.0, 1.04, 1.10, 1.15, 1.17, 1.36, 1.37, 1.63, 1.81]


def committed_per_step(match: list[bool], k: int) -> float:
    accepted, steps = acceptance.chains(match, k)
    return 1 + accepted / steps


def main() -> None:
    torch.set_num_threads(2)
    data, model = acceptance.target_answers(), acceptance.draft_variant("4")
    losses = []
    for d in data:
        match = acceptance.answer_matches(model, d)
        real = {k: committed_per_step(match, k) for k in range(1, 9)}
        speed = {k: real[k] / (k * C + V[k]) for k in real}
        alpha = effective_alpha(real[4], 4)
        modelled = {k: expected_tokens(alpha, k) / (k * C + V[k]) for k in real}
        chosen, best = max(modelled, key=modelled.get), max(speed, key=speed.get)
        losses.append(speed[chosen] / speed[best])
        print(f"{d['category']:10s} alpha {alpha:.2f}: chosen k {chosen}, best k {best}, "
              f"speed at chosen / best {losses[-1]:.3f}")
    print(f"mean {statistics.mean(losses):.4f}, worst {min(losses):.3f} over {len(losses)} prompts")


if __name__ == "__main__":
    main()
