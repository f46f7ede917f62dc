"""Log probabilities of emitted tokens, from the target's distribution at each emitted position.

They are the raw distribution's (log-softmax of the target's logits, before temperature, top-k/p and min-p: vLLM's
default `raw_logprobs`), so they do not depend on how the token was chosen: a token accepted from a draft, the one
recovered after a rejection, or the bonus token each get the logprob that plain decoding would report there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_TOP_LOGPROBS = 20       # OpenAI's limit for chat top_logprobs (vLLM's default max_logprobs is 20 too)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)    # the most likely tokens, most likely first


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprob]:
    """logits [n, V] (row i: the distribution token_ids[i] was chosen from) -> one TokenLogprob per token."""
    n = len(token_ids)
    if n == 0:
        return []
    lp = torch.log_softmax(logits[:n].float(), dim=-1)                      # [n, V]
    chosen = lp[torch.arange(n, device=lp.device), torch.tensor(token_ids, device=lp.device)].tolist()
    if num_top > 0:
        vals, idx = lp.topk(num_top, dim=-1)                                # [n, num_top] each, sorted
        tops = [list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())]
    else:
        tops = [[] for _ in range(n)]
    return [TokenLogprob(t, c, top) for t, c, top in zip(token_ids, chosen, tops)]
