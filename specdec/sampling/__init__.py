from .logits import probs_from_logits, sample
from .rejection import verify_greedy, verify_ragged, verify_sampling, verify_sampling_batch

__all__ = ["probs_from_logits", "sample", "verify_greedy", "verify_ragged", "verify_sampling", "verify_sampling_batch"]
