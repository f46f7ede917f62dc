"""Verification of draft tokens against the target: pure functions over tensors.

Vocabulary: the target accepts a prefix of the k draft tokens; at the first rejection it emits a
*recovered* token; when all k are accepted it emits a *bonus* token from its own distribution at
position k+1. Either way one verification yields accepted + 1 tokens.
"""
from __future__ import annotations

import torch

PAD = -1  # fills emitted rows past their last token


def verify_greedy(target_argmax: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Greedy verification: accept while the draft equals the target's argmax.

    target_argmax: [k+1] argmax of the target at each draft position and one beyond.
    draft_tokens:  [k]
    Returns (num_accepted, emitted [num_accepted + 1]): the accepted drafts, then the target's argmax
    at the first mismatch (recovered) or after the last draft (bonus).
    """
    k = draft_tokens.shape[0]
    mismatch = (draft_tokens != target_argmax[:k]).nonzero()
    n = int(mismatch[0]) if mismatch.numel() else k
    return n, target_argmax[: n + 1].clone()


def verify_sampling_batch(p_target: torch.Tensor, q_draft: torch.Tensor | None, draft_tokens: torch.Tensor,
                          generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023), for a batch.

    p_target:     [B, k+1, V] target probabilities at each draft position and one beyond (already
                  processed by temperature / top-k / top-p / min-p).
    q_draft:      [B, k, V] the draft's probabilities, processed the same way; None for a deterministic
                  proposer (n-gram), i.e. a one-hot q: accept x with probability p_target(x).
    draft_tokens: [B, k] tokens drawn from q_draft.

    Draft token x_i is accepted with probability min(1, p_target(x_i) / q_draft(x_i)); at the first
    rejection the recovered token is drawn from normalize(max(0, p_target - q_draft)); if all k are
    accepted the bonus token is drawn from p_target[k]. The emitted tokens are then distributed
    exactly as the target's own samples.
    Returns num_accepted [B] and emitted [B, k+1] (row b: num_accepted[b] + 1 tokens, then PAD).
    """
    B, k = draft_tokens.shape
    rows = torch.arange(B, device=p_target.device)
    p_x = p_target[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)             # [B, k]
    q_x = torch.ones_like(p_x) if q_draft is None else q_draft.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    u = torch.rand(B, k, generator=generator, device=p_target.device)
    accept = u * q_x < p_x                  # u < p/q without dividing; q_x > 0 for drawn tokens
    n = accept.long().cumprod(-1).sum(-1)   # [B] leading accepts
    p_n = p_target[rows, n]                 # [B, V] target at the first rejected position (or bonus)
    at = n.clamp(max=max(k - 1, 0))
    if k == 0:
        q_n = torch.zeros_like(p_n)
    elif q_draft is None:
        q_n = torch.zeros_like(p_n).scatter_(-1, draft_tokens[rows, at].unsqueeze(-1), 1.0)
    else:
        q_n = q_draft[rows, at]
    residual = (p_n - q_n).clamp_min(0.0)
    residual = torch.where((n == k).unsqueeze(-1), p_n, residual)   # all accepted: bonus from p_target
    total = residual.sum(-1, keepdim=True)
    # total == 0 only if p == q at that position (rejection then has probability 0, bar rounding)
    residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p_n)
    extra = torch.multinomial(residual, 1, generator=generator).squeeze(-1)               # [B]
    positions = torch.arange(k + 1, device=p_target.device)
    emitted = torch.cat([draft_tokens, torch.full((B, 1), PAD, dtype=draft_tokens.dtype, device=draft_tokens.device)], 1)
    emitted = torch.where(positions < n.unsqueeze(-1), emitted, torch.full_like(emitted, PAD))
    emitted[rows, n] = extra
    return n, emitted


def verify_sampling(p_target: torch.Tensor, q_draft: torch.Tensor | None, draft_tokens: torch.Tensor,
                    generator: torch.Generator | None) -> tuple[int, torch.Tensor]:
    """One sequence: p_target [k+1, V], q_draft [k, V] or None, draft_tokens [k].

    Returns (num_accepted, emitted [num_accepted + 1]); see verify_sampling_batch.
    """
    n, emitted = verify_sampling_batch(p_target[None], None if q_draft is None else q_draft[None],
                                       draft_tokens[None], generator)
    n0 = int(n[0])
    return n0, emitted[0, : n0 + 1]
