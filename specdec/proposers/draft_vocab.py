"""The draft model's output head cut to the tokens its target emits (FR-Spec, Zhao et al. 2025; EAGLE-3's draft
vocabulary): the 0.5B draft's 151,936-row head is over a quarter of the bytes its step reads, and most of its rows
are tokens a coding assistant never writes.

A ranking of the target's vocabulary (most emitted first) ships beside the target's heads
(`specdec/heads/<target>/draft-vocab.safetensors`, made by tools/draft_vocab.py); `draft_vocab_size` keeps its first
N rows. Exactness does not depend on the cut: a sampled draft token's q_draft is the draft's distribution over the
rows it keeps (zero elsewhere), and the verifier's residual max(0, p_target - q_draft) gives the target's
probability to the tokens the draft cannot propose (proposers/draft_model.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import SpecDecError
from ..models.heads import SHIPPED
from ..utils import atomic_path

# rows kept by default where a ranking ships (docs/benchmarks/draft-vocab: the draft's step and acceptance by size)
DEFAULT_DRAFT_VOCAB = 32768
RANKING_FILE = "draft-vocab.safetensors"


def ranking_path(target_name: str) -> Path:
    return SHIPPED / target_name / RANKING_FILE


def save_ranking(path: Path, ranked: torch.Tensor, metadata: dict[str, str]) -> None:
    """Write a ranking (int32 token ids, most emitted first) atomically."""
    from safetensors.torch import save_file

    with atomic_path(Path(path)) as tmp:
        save_file({"token_ids": ranked.to(torch.int32).contiguous()}, str(tmp), metadata=metadata)


def load_ranking(path: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(path))["token_ids"].long()


def draft_output_ids(target_name: str, size: int | None, vocab_size: int) -> torch.Tensor | None:
    """The draft head's rows (ascending token ids) for a target: its ranking's first `size` tokens; size None: the
    default where a ranking ships for the target (else the whole head); 0 or at least the vocabulary: the whole
    head (None)."""
    path = ranking_path(target_name)
    if size is None:
        if not path.is_file():
            return None
        size = DEFAULT_DRAFT_VOCAB
    if size == 0 or size >= vocab_size:
        return None
    if not path.is_file():
        raise SpecDecError(f"draft_vocab_size {size}: no token ranking ships for target '{target_name}' "
                           f"(draft_vocab_size 0 keeps the draft's whole output head)")
    ranked = load_ranking(path)
    ranked = ranked[ranked < vocab_size]
    return ranked[:size].sort().values
