"""The step's verifier: every sequence that samples this step, its drafted tokens checked against the target's rows.

Chains go through `verify_ragged` together (greedy and sampled mixed, exact speculative sampling), a token tree through
`verify_tree_greedy` (greedy requests without a grammar only: the engine drafts trees for no others), and a
constrained request's rows are masked first, row j by the grammar's state after the draft's first j tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .grammar import Constraint, apply_masks
from .penalties import Penalties
from .rejection import verify_ragged, verify_tree_greedy

if TYPE_CHECKING:      # SamplingParams sits a layer above sampling (it holds a grammar spec)
    from ..sampling_params import SamplingParams


@dataclass
class Verification:
    """One sequence's part of the step's verification."""
    logits: torch.Tensor                 # [rows, V'] the target's logits at its rows (the newest token's, then drafts')
    draft_tokens: torch.Tensor           # [k] (k may be 0: a plain step, or a prompt's first token)
    q_draft: torch.Tensor | None         # [k, V] the draft's probabilities; None: one-hot (lookup) or greedy
    parents: list[int] | None            # a token tree's parents (node -> parent node, -1: the newest token)
    params: SamplingParams
    generator: torch.Generator | None
    constraint: Constraint | None = None
    penalties: Penalties | None = None   # repetition penalties, logit_bias, min_tokens: row j after the first j drafts


def verify_step(items: list[Verification], vocab_size: int) -> list[tuple[int, list[int], list[int] | None]]:
    """Per sequence (num_accepted, emitted, kept): `kept` lists the verification rows whose tokens were kept, in order
    (the newest token's row, then the accepted path's) for a token tree, None for a chain (rows 0..num_accepted)."""
    V = vocab_size
    out: list = [None] * len(items)
    chains = []
    for j, it in enumerate(items):
        if it.parents is None:
            chains.append(j)
            continue
        path, emitted = verify_tree_greedy(it.logits[:, :V].argmax(-1).tolist(), it.draft_tokens.tolist(), it.parents)
        out[j] = (len(path), emitted, [0] + [i + 1 for i in path])
    chained = [items[j] for j in chains]
    results = verify_ragged(
        [_adjusted(it.logits[:, :V], it) for it in chained],
        [it.draft_tokens for it in chained],
        [None if it.q_draft is None else it.q_draft[:, :V].to(it.logits.device) for it in chained],
        [it.params for it in chained], [it.generator for it in chained])
    for j, (n, emitted) in zip(chains, results):
        out[j] = (n, emitted, None)
    return out


def _adjusted(logits: torch.Tensor, it: Verification) -> torch.Tensor:
    """The rows the request samples from: its penalties and bias, then its grammar's masks. Where min_tokens
    masks the only tokens the grammar still allows (the grammar ends before min_tokens), the grammar wins."""
    if it.penalties is None:
        return _constrained(logits, it.draft_tokens, it.constraint)
    out = _constrained(it.penalties.apply(logits, it.draft_tokens.tolist()), it.draft_tokens, it.constraint)
    dead = ~torch.isfinite(out).any(-1)
    if bool(dead.any()):
        out[dead] = _constrained(logits.float(), it.draft_tokens, it.constraint)[dead]
    return out


def _constrained(logits: torch.Tensor, draft_tokens: torch.Tensor, constraint: Constraint | None) -> torch.Tensor:
    """A constrained request's rows with the grammar's masks applied (row j: after the draft's first j)."""
    if constraint is None:
        return logits
    return apply_masks(logits, constraint.row_masks(draft_tokens.tolist()))
