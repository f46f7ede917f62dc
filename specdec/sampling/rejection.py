"""Verification of draft tokens against the target: pure functions over tensors.

Vocabulary: the target accepts a prefix of the k draft tokens; at the first rejection it emits a
*recovered* token; when all k are accepted it emits a *bonus* token from its own distribution at
position k+1. Either way one verification yields accepted + 1 tokens.
"""
from __future__ import annotations

import torch


def verify_tree_greedy(target_argmax: list[int], draft_tokens: list[int],
                       parents: list[int]) -> tuple[list[int], list[int]]:
    """Greedy verification of a token tree: follow the target's argmax down the tree while a child holds it.

    target_argmax: per verification row (row 0: the newest token, row i+1: draft node i), the target's argmax.
    draft_tokens, parents: node i's token and parent node (-1: the newest token); parents come first.
    Returns (path, emitted): the accepted nodes root to leaf, and the emitted tokens (theirs, then the target's
    argmax after the last: recovered or bonus), exactly what greedy decoding of the target would produce.
    """
    children: dict[tuple[int, int], int] = {}
    for i, (tok, p) in enumerate(zip(draft_tokens, parents)):
        children.setdefault((p, tok), i)            # a duplicate sibling can never be reached: the first wins
    path, node = [], -1
    while (nxt := children.get((node, target_argmax[node + 1]))) is not None:
        path.append(nxt)
        node = nxt
    return path, [draft_tokens[i] for i in path] + [target_argmax[node + 1]]


def verify_ragged(logits: list[torch.Tensor], draft_tokens: list[torch.Tensor], q_drafts: list[torch.Tensor | None],
                  params: list, generators: list[torch.Generator | None]) -> list[tuple[int, list[int]]]:
    """Verify the drafts of a whole step: greedy and sampled sequences mixed, each its own draft length.

    logits[i]:       [k_i + 1, V] the target's logits at sequence i's rows (fp32, vocabulary already cut)
    draft_tokens[i]: [k_i] (k_i may be 0: a plain step samples one token)
    q_drafts[i]:     [k_i, V] the draft's probabilities, or None for a one-hot proposer (n-gram) or greedy
    params[i]:       the sequence's sampling parameters (`greedy`, `temperature`, `top_k`, `top_p`, `min_p`)
    generators[i]:   the sequence's generator, on the logits' device
    Returns per sequence (num_accepted, emitted tokens). Greedy rows share one argmax and one host sync; sampled
    rows share one vectorised rejection step (see `_verify_sampled`).
    """
    out: list[tuple[int, list[int]] | None] = [None] * len(logits)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        argmax = torch.cat([logits[i] for i in greedy]).argmax(-1).tolist()
        drafts = [draft_tokens[i].tolist() for i in greedy]
        at = 0
        for i, d in zip(greedy, drafts):
            row = argmax[at: at + len(d) + 1]
            at += len(d) + 1
            n = next((j for j, (a, b) in enumerate(zip(d, row)) if a != b), len(d))
            out[i] = (n, row[: n + 1])
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        from .logits import probs_from_logits

        # one probability computation per distinct sampling setting (a batch usually has one or two)
        groups: dict[tuple, list[int]] = {}
        for i in sampled:
            p = params[i]
            groups.setdefault((p.temperature, p.top_k, p.top_p, p.min_p), []).append(i)
        probs: dict[int, torch.Tensor] = {}
        for (temperature, top_k, top_p, min_p), members in groups.items():
            rows = probs_from_logits(torch.cat([logits[i] for i in members]), temperature, top_k, top_p, min_p)
            for i, part in zip(members, rows.split([logits[i].shape[0] for i in members])):
                probs[i] = part
        p_target = [probs[i] for i in sampled]
        results = _verify_sampled(p_target, [q_drafts[i] for i in sampled],
                                  [draft_tokens[i].to(p_target[0].device) for i in sampled],
                                  [generators[i] for i in sampled])
        for i, r in zip(sampled, results):
            out[i] = r
    return out


def _pad(rows: list[torch.Tensor], padding_value: float = 0.0) -> torch.Tensor:
    """pad_sequence(rows, batch_first=True), by one stack when every row has the same length (the usual step: one
    draft length for all), several times faster over many rows."""
    if all(r.shape == rows[0].shape for r in rows):
        return torch.stack(rows)
    from torch.nn.utils.rnn import pad_sequence

    return pad_sequence(rows, batch_first=True, padding_value=padding_value)


def _verify_sampled(p_target: list[torch.Tensor], q_draft: list[torch.Tensor | None], draft_tokens: list[torch.Tensor],
                    generators: list[torch.Generator | None]) -> list[tuple[int, list[int]]]:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1) for a ragged batch, one generator per sequence.

    Sequence i draws exactly k_i + 1 uniforms from its own generator (k_i acceptance tests, then one for the
    recovered or bonus token, drawn by inverse CDF), so its result does not depend on its neighbours. The rest is
    one padded tensor computation: accept x_j while u_j * q(x_j) < p(x_j); at the first rejection draw from
    normalize(max(0, p − q)), after k_i acceptances from p at position k_i (a one-hot q for n-gram drafts).
    """
    B = len(p_target)
    device, V = p_target[0].device, p_target[0].shape[-1]
    k_list = [len(d) for d in draft_tokens]
    ks = torch.tensor(k_list, device=device)
    k_max = max(k_list)
    # row i: its k_i test uniforms, then the one for its last token (the rest padding, never read)
    U = _pad([torch.rand(k + 1, generator=g, device=device) for k, g in zip(k_list, generators)], 1.0)
    u_extra = U.gather(1, ks[:, None]).squeeze(1)                                   # [B]
    if k_max:
        D = _pad(list(draft_tokens))                                                 # [B, k_max]
        if all(q is None for q in q_draft):                                         # one-hot drafts (n-gram)
            Q = torch.nn.functional.one_hot(D, V).float()
        else:
            empty = torch.empty(0, V, device=device)
            Q = _pad([empty if k == 0 else (q if q is not None else torch.nn.functional.one_hot(d, V).float())
                      for k, q, d in zip(k_list, q_draft, draft_tokens)])           # [B, k_max, V]
    else:
        Q = torch.zeros(B, 1, V, device=device)
        D = torch.zeros(B, 1, dtype=torch.long, device=device)
    P = _pad(list(p_target))                                                         # [B, k_max + 1, V]
    rows = torch.arange(B, device=device)
    p_x = P[:, :-1].gather(-1, D[:, :k_max, None]).squeeze(-1) if k_max else torch.zeros(B, 0, device=device)
    q_x = Q[:, :k_max].gather(-1, D[:, :k_max, None]).squeeze(-1)
    accept = (U[:, :k_max] * q_x < p_x) & (torch.arange(k_max, device=device) < ks[:, None])   # padding never accepts
    n = accept.long().cumprod(-1).sum(-1) if k_max else torch.zeros(B, dtype=torch.long, device=device)   # [B]
    p_n = P[rows, n]                                                                  # [B, V]
    q_n = Q[rows, n.clamp(max=max(k_max - 1, 0))]
    residual = torch.where((n == ks)[:, None], p_n, (p_n - q_n).clamp_min(0.0))
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual, p_n)     # p == q at the rejection point: probability 0, bar rounding
    cdf = residual.cumsum(-1)
    extra = torch.searchsorted(cdf, (u_extra * cdf[:, -1])[:, None], right=True).squeeze(-1).clamp(max=V - 1)
    n_list, extra_list, d_rows = n.tolist(), extra.tolist(), D.tolist()
    return [(n_i, d[:n_i] + [x]) for n_i, x, d in zip(n_list, extra_list, d_rows)]
