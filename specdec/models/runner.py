"""Run a model over a ragged batch: each sequence contributes its new tokens at its own cache positions.

Shared by the engine (target: prefill chunks beside plain and verification rows) and the draft proposer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attn_metadata import causal_metadata, tree_keys
from .kv_cache import SeqKV, WindowedKV


@dataclass
class Span:
    kv: SeqKV                    # the sequence's cache, large enough for start + len(token_ids) (key-block padded)
    start: int                   # cache position of token_ids[0]
    token_ids: list[int]
    logits: str = "last"         # which rows need logits: "last", "all" or "none"
    decode: bool = False         # generated tokens (a decode step, verification rows), not prompt tokens: their
                                 # attention runs row by row (see models/attn_metadata.py)
    hidden: bool = False         # also return the rows' hidden states at the layers forward_spans is asked for
    parents: list[int] | None = None   # a token tree (decode): row i's parent row (row 0, the newest token: -1); row
                                 # i sits at cache slot start+i and position start+depth(i), attending over its path
    # a level of a tree grown across forwards (a draft model's tree): row i's path as cache slots -- its ancestors'
    # (written by earlier forwards) then its own, start+i -- after `tree_base` committed positions; its position is
    # tree_base + len(path) - 1
    paths: list[list[int]] | None = None
    tree_base: int = 0

    def layout(self) -> tuple[list[int], torch.Tensor | None]:
        """Positions of the rows, and the tree's key lists (None for causal rows)."""
        n = len(self.token_ids)
        if self.paths is not None:
            if len(self.paths) != n or any(not p or p[-1] != self.start + i or min(p) < self.tree_base
                                           for i, p in enumerate(self.paths)):
                raise ValueError("token tree: each row's path must end at its own slot, after the committed positions")
            return [self.tree_base + len(p) - 1 for p in self.paths], tree_keys(self.paths, self.tree_base)
        if self.parents is None:
            return list(range(self.start, self.start + n)), None
        paths: list[list[int]] = []
        for i, p in enumerate(self.parents):
            if not -1 <= p < i or (p == -1) != (i == 0):
                raise ValueError(f"token tree: row {i}'s parent {p} must be an earlier row (only row 0 is the root)")
            paths.append((paths[p] if p >= 0 else []) + [self.start + i])
        return [self.start + len(p) - 1 for p in paths], tree_keys(paths, self.start)


@torch.inference_mode()
def forward_spans(model, spans: list[Span], aux_layers: tuple[int, ...] = ()):
    """One forward over every span; per span its logits  # [rows, V] fp32 (rows: 1, len(token_ids) or None).

    With aux_layers, returns (logits, hidden): hidden per span is {layer: [len(token_ids), H]} for spans with
    `hidden` set (None for the others), from the same forward (see Transformer.forward)."""
    device = model.embed_tokens.weight.device
    ids, pos, want, trees, layouts = [], [], [], [], []
    row = 0
    for s in spans:
        n = len(s.token_ids)
        ids += s.token_ids
        positions, tree = s.layout()
        pos += positions
        trees.append(tree)
        layouts.append(positions)
        if s.logits == "all":
            want.append((row, row + n))
        elif s.logits == "last":
            want.append((row + n - 1, row + n))
        else:
            want.append(None)
        row += n
    attn = causal_metadata([(s.kv, s.start, len(s.token_ids), s.decode, t) for s, t in zip(spans, trees)],
                           model.min_query_rows, model.key_block, device)
    if spans and isinstance(spans[0].kv, WindowedKV):
        attn.local = causal_metadata([_local_span(s, t, min(p, default=s.start))
                                      for s, t, p in zip(spans, trees, layouts)],
                                     model.min_query_rows, model.key_block, device)
    out = model(torch.tensor(ids, dtype=torch.long, device=device),
                torch.tensor(pos, dtype=torch.long, device=device), attn, aux_layers)
    if not aux_layers:
        return _logits(model, out, want)                                            # out: [N, hidden]
    hidden, aux = out
    per_span, row = [], 0
    for s in spans:
        n = len(s.token_ids)
        per_span.append({i: h[row: row + n] for i, h in aux.items()} if s.hidden else None)
        row += n
    return _logits(model, hidden, want), per_span


def _local_span(s: Span, tree: torch.Tensor | None, first_position: int) -> tuple:
    """A span's rows in its WindowedKV's local span: cache positions (and a tree's slots) less the span's base. Every
    row must see its whole window there (KVManager.ensure slides the span so)."""
    kv = s.kv
    if (kv.base > max(0, first_position - kv.window + 1)
            or s.start + len(s.token_ids) - kv.base > kv.local.capacity):
        raise ValueError(f"rows at {s.start}..{s.start + len(s.token_ids) - 1} are outside the local span "
                         f"{kv.base}..{kv.base + kv.local.capacity - 1}")
    if tree is not None:
        tree = tree.clone()
        tree[:, 0] -= kv.base
        tree[:, 1:][tree[:, 1:] >= 0] -= kv.base
    return kv.local, s.start - kv.base, len(s.token_ids), s.decode, tree


def _logits(model, hidden: torch.Tensor, want: list) -> list[torch.Tensor | None]:
    device = hidden.device
    rows = [r for w in want if w is not None for r in range(*w)]
    if not rows:
        return [None] * len(want)
    logits = model.compute_logits(hidden[torch.tensor(rows, device=device)])       # [R, V]
    out, i = [], 0
    for w in want:
        if w is None:
            out.append(None)
        else:
            n = w[1] - w[0]
            out.append(logits[i: i + n])
            i += n
    return out


def exact_rows(model) -> bool:
    """Whether a token's K/V has the same bits however it was computed -- in a prompt chunk of any size, as a
    decode step or as a verification row -- when every row takes the row-by-row attention (`Span.decode`). True for
    bf16 and int4 on CPU with the compiled ops: their attention is batch-invariant by construction and the linears
    are too (`batch_invariant`, packed_linear.py). Elsewhere (fp32, whose GEMMs round by row count; CUDA; the eager
    fallback) prompt rows keep flash attention and generated tokens' K/V is recomputed before a next turn may reuse
    it (LLMEngine.settle). A sliding-window model's local layers take the same row-by-row kernel with the window."""
    from . import cpu_ops

    return model.batch_invariant and cpu_ops.fused_available(model.embed_tokens.weight)


def forward_once(model, token_ids: list[int]) -> torch.Tensor:
    """Logits of every position of one standalone sequence  # [T, V] (tests, the divergence margin)."""
    kv = model.new_kv()
    kv.resize(-(-len(token_ids) // model.key_block) * model.key_block)
    return forward_spans(model, [Span(kv, 0, list(token_ids), "all")])[0]
