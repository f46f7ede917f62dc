"""What a head learns from: the draft vocabulary (the most frequent tokens of the training text), the target's
teacher-forced features (the hidden states a head reads and the target's top-k next-token probabilities), and the
soft targets and cross-entropy over the draft vocabulary (train/head_trainer.py drives them)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Features:
    tokens: list[torch.Tensor]          # per document [T] long
    states: list[torch.Tensor]          # per document [T, S] the head's input states (runtime dtype)
    top_ids: list[torch.Tensor]         # per document [T, K] int32 target ids of the top-k next tokens
    top_p: list[torch.Tensor]           # per document [T, K] fp32 their probabilities

    def window(self, doc: int, start: int, end: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[doc][start:end] for t in (self.tokens, self.states, self.top_ids, self.top_p))


def target_head_weight(model) -> torch.Tensor:
    """The target's output head as a float matrix [V, H], whatever kernel it was packed for (head(I) = W^T)."""
    H = model.config.hidden_size
    eye = torch.eye(H, dtype=model.embed_tokens.weight.dtype, device=model.embed_tokens.weight.device)
    return model.compute_logits(eye).t().contiguous()                                   # [V, H] fp32


def draft_vocabulary(docs: list[list[int]], size: int, vocab: int, always: list[int]) -> torch.Tensor:
    """The `size` most frequent tokens of the text (ties: lower id) plus `always`, ascending  # [<= size]"""
    counts = token_counts(docs, vocab)
    for t in always:
        counts[t] = counts.max() + 1
    order = torch.argsort(-counts * vocab - (vocab - torch.arange(vocab)), stable=True)
    return torch.sort(order[: min(size, vocab)]).values


def token_counts(docs: list[list[int]], vocab: int) -> torch.Tensor:
    """[vocab] how often each token occurs in the text."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for w in docs:
        counts += torch.bincount(torch.tensor(w, dtype=torch.long), minlength=vocab)[:vocab]
    return counts


def refreshed_vocabulary(current: torch.Tensor, docs: list[list[int]], swaps: int, vocab: int,
                         always: list[int]) -> torch.Tensor:
    """A trained head's draft vocabulary (ascending target ids) with up to `swaps` of its tokens that are rarest in
    the text replaced by the most frequent tokens it lacks, pair by pair while the newcomer occurs more than twice
    as often; `always` stays.  # [len(current)] ascending"""
    counts = token_counts(docs, vocab)
    have = torch.zeros(vocab, dtype=torch.bool)
    have[current] = True
    keep = counts.clone()
    keep[torch.tensor(always, dtype=torch.long)] = counts.max() + 1
    lacking = torch.argsort(-(counts * ~have), stable=True)[:swaps]                # most frequent first
    rarest = current[torch.argsort(keep[current], stable=True)][:swaps]           # rarest first
    pairs = counts[lacking] > 2 * keep[rarest]
    out = torch.cat([current[~torch.isin(current, rarest[pairs])], lacking[pairs]])
    return torch.sort(out).values


@torch.inference_mode()
def teacher_forced_pass(model, ids: list[int], layers: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One forward of the target over a whole sequence in a fresh cache -> (logits [T, V], {layer: states [T, H]})."""
    from ..models.runner import Span, forward_spans

    kv = model.new_kv()
    kv.resize(-(-len(ids) // model.key_block) * model.key_block)
    logits, hidden = forward_spans(model, [Span(kv, 0, ids, "all", hidden=True)], layers)
    return logits[0], hidden[0]


@torch.inference_mode()
def extract_features(model, docs: list[list[int]], layers: tuple[int, ...], topk: int, progress: bool) -> Features:
    from ..utils import progress_bar

    feats = Features([], [], [], [])
    for w in progress_bar(docs, "features", progress):
        logits, hidden = teacher_forced_pass(model, list(w), layers)
        p = torch.softmax(logits, -1)
        top_p, top_ids = p.topk(topk, -1)
        feats.tokens.append(torch.tensor(w))
        feats.states.append(torch.cat([hidden[i] for i in layers], -1).clone())
        feats.top_ids.append(top_ids.to(torch.int32))
        feats.top_p.append(top_p.float())
    return feats


def soft_targets(top_ids: torch.Tensor, top_p: torch.Tensor, t2d: torch.Tensor, vd: int) -> tuple[torch.Tensor,
                                                                                                    torch.Tensor]:
    """top-k target ids/probs [..., K] -> (distribution over the draft vocabulary [..., vd], weight [...]): the
    top-k mass inside the draft vocabulary, renormalised; weight 0 where the target's top token is outside it."""
    d = t2d[top_ids.long()]                                            # [..., K] draft index or -1
    inside = d >= 0
    dense = torch.zeros(*top_ids.shape[:-1], vd, dtype=torch.float32, device=top_ids.device)
    dense.scatter_add_(-1, d.clamp(min=0), top_p.float() * inside)
    mass = dense.sum(-1, keepdim=True)
    weight = (inside[..., 0] & (mass[..., 0] > 0)).float()
    return dense / mass.clamp(min=1e-9), weight


def soft_ce(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # logits/target [B, T, vd], weight [B, T] -> (loss, top-1 agreement) over weighted rows
    logp = torch.log_softmax(logits.float(), -1)
    loss = -(target * logp).sum(-1)
    n = weight.sum().clamp(min=1)
    agree = ((logits.argmax(-1) == target.argmax(-1)).float() * weight).sum() / n
    return (loss * weight).sum() / n, agree
