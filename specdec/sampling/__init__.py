from .logits import probs_from_logits, sample
from .rejection import verify_ragged, verify_tree_greedy

__all__ = ["probs_from_logits", "sample", "verify_ragged", "verify_tree_greedy"]
