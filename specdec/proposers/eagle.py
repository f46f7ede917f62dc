"""EAGLE-3: a one-layer head drafts from the target's own hidden states, for many sequences at once.

The head keeps a KV cache per sequence (one layer). Each row it caches at position t was fed the target's states at
t and the token at t+1. After every target forward the engine hands over the states of the rows it committed
(`accept_hidden`); at the next `propose` they are fed in one batched forward of the head (the prompt, on the first
call), whose last row drafts the first token; each further draft row feeds the head its own output and its last
guess (`Eagle3Head.forward`). Those speculative rows are dropped at the next call (the cache goes back to the rows
fed with target states), exactly as in vLLM and the EAGLE reference.
"""
from __future__ import annotations

import torch

from ..engine.kv_manager import KVManager
from ..models.attn_metadata import causal_metadata
from ..models.eagle3 import Eagle3Head
from .base import Draft, ProposalContext, Proposer, draft_token, empty_draft, scatter_vocab

DECODE_ROWS = 16     # feeds up to this many rows take the row-by-row attention


class _Pending:
    """Target states of committed rows not yet fed to the head: positions start .. start+count-1."""

    def __init__(self, start: int):
        self.start, self.count = start, 0
        self.rows: list[torch.Tensor] = []     # [n_i, 3H] chunks, contiguous in position

    def add(self, start: int, rows: torch.Tensor) -> None:
        if start != self.start + self.count:    # not contiguous (cannot happen in the engine): start over there
            self.start, self.count, self.rows = start, 0, []
        self.rows.append(rows)
        self.count += rows.shape[0]

    def take(self) -> torch.Tensor:
        out = torch.cat(self.rows)
        self.start += self.count
        self.rows, self.count = [], 0
        return out


class Eagle3Proposer(Proposer):
    name = "eagle3"

    def __init__(self, head: Eagle3Head, embed: torch.nn.Embedding, vocab_size: int, max_total_tokens: int):
        self.head = head
        self.embed = embed                          # the target's embedding (the head has none of its own)
        self.vocab_size = vocab_size
        self.kv = KVManager(head, max_total_tokens)
        self.target_hidden = tuple(head.cfg.aux_layers)
        self.pending: dict[int, _Pending] = {}
        self.fed: dict[int, int] = {}               # positions cached with target states
        self.d2t = head.draft_to_target             # [draft_vocab] target ids
        self.dtype = head.input_layernorm.weight.dtype

    def accept_hidden(self, seq_id: int, start: int, hidden: dict[int, torch.Tensor]) -> None:
        rows = torch.cat([hidden[i] for i in self.target_hidden], -1)          # [n, 3H]
        self.pending.setdefault(seq_id, _Pending(start)).add(start, rows)

    @torch.inference_mode()
    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        drafted: list[list[int]] = [[] for _ in ctxs]
        q_rows: list[list[torch.Tensor]] = [[] for _ in ctxs]
        owners, feeds = [], []                      # (kv, start, token ids, target states, seq id) per drafting seq
        for i, (ctx, k) in enumerate(zip(ctxs, ks)):
            if k <= 0:
                continue
            n = len(ctx.token_ids)
            fed = self.fed.get(ctx.seq_id, 0)
            pend = self.pending.get(ctx.seq_id)
            # the rows to feed: positions fed .. n-2, each with the token after it (the newest token is n-1)
            if pend is None or pend.start != fed or fed + pend.count != n - 1:
                continue                             # states missing (cannot happen in the engine): no draft
            kv = self.kv.ensure(ctx.seq_id, n - 1 + k)
            self.kv.truncate(ctx.seq_id, fed)        # forget last step's speculative rows
            feeds.append((kv, fed, ctx.token_ids[fed + 1: n], pend.take(), ctx.seq_id))
            owners.append(i)
            self.fed[ctx.seq_id] = n - 1
        if not feeds:
            return [empty_draft() for _ in ctxs]
        device = self.d2t.device
        ids = torch.tensor([t for f in feeds for t in f[2]], dtype=torch.long, device=device)
        g = self.head.fuse(torch.cat([f[3] for f in feeds]).to(self.dtype))                   # [rows, H]
        positions = torch.cat([torch.arange(f[1], f[1] + len(f[2])) for f in feeds]).to(device)
        attn = causal_metadata([(f[0], f[1], len(f[2]), len(f[2]) <= DECODE_ROWS) for f in feeds], device=device)
        h = self.head(self.embed(ids), g, positions, attn)                         # [rows, H]
        last = torch.tensor([-1 + sum(len(f[2]) for f in feeds[: j + 1]) for j in range(len(feeds))], device=device)
        for f in feeds:
            self.kv.commit(f[4], f[1] + len(f[2]))
        h_last = h[last]                                                            # [S, H]
        active = list(range(len(owners)))
        while active:
            logits = scatter_vocab(self.head.compute_logits(h_last[active]), self.d2t, self.head.cfg.vocab_size,
                                   self.vocab_size)                                 # [A, V]
            nxt = []
            for row, j in enumerate(active):
                i = owners[j]
                tok = draft_token(logits[row: row + 1], ctxs[i], q_rows[i])
                drafted[i].append(tok)
                if len(drafted[i]) < ks[i]:
                    nxt.append(j)
            if not nxt:
                break
            # one row per sequence still drafting: its own last output and its last guess, at the next position
            kvs = [feeds[j][0] for j in nxt]
            starts = [kv.length for kv in kvs]                                       # the next position
            attn = causal_metadata([(kv, s, 1, True) for kv, s in zip(kvs, starts)], device=device)
            toks = torch.tensor([drafted[owners[j]][-1] for j in nxt], dtype=torch.long, device=device)
            h_new = self.head(self.embed(toks), h_last[nxt], torch.tensor(starts, device=device), attn)
            for j, s in zip(nxt, starts):
                self.kv.commit(feeds[j][4], s + 1)
            h_last = h_last.clone()
            h_last[nxt] = h_new
            active = nxt
        for ctx in ctxs:
            if ctx.constraint is not None:
                ctx.constraint.rollback_draft()
        return [Draft(torch.tensor(d, dtype=torch.long), torch.stack(q) if q else None)
                for d, q in zip(drafted, q_rows)]

    def release(self, seq_id: int) -> None:
        self.kv.free_seq(seq_id)
        self.pending.pop(seq_id, None)
        self.fed.pop(seq_id, None)

    @property
    def weight_bytes(self) -> int:
        return self.head.weight_nbytes()

    @property
    def cache_bytes(self) -> int:
        return self.kv.nbytes
