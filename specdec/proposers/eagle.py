"""EAGLE-3: a one-layer head drafts from the target's own hidden states, for many sequences at once.

The head keeps a KV cache per sequence (one layer). Each row it caches at position t was fed the target's states at
t and the token at t+1. After every target forward the engine hands over the states of the rows it committed
(`accept_hidden`); at the next `propose` they are fed in one batched forward of the head (the prompt, on the first
call), whose last row drafts the first token; each further draft row feeds the head its own output and its last
guess (`Eagle3Head.forward`). Those speculative rows are dropped at the next call (the cache goes back to the rows
fed with target states), exactly as in vLLM and the EAGLE reference.

A greedy request that asks for a tree (eagle_topk > 1) is drafted EAGLE-2 style (proposers/tree.py): each level's
best nodes are expanded in one forward of the head, a row per node, each attending over the committed rows and its
own ancestors' rows only (a tree mask), and the likeliest nodes of the whole tree go to verification.
"""
from __future__ import annotations

import torch

from ..models.attn_metadata import causal_metadata, tree_keys
from ..models.eagle1 import EagleHead
from ..models.eagle3 import Eagle3Head
from ..models.kv_manager import KVManager
from .base import BuildContext, Draft, ProposalContext, Proposer, empty_draft, head_draft_token
from .method import Method
from .tree import TreeBuilder

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
    prefix_needs_cache = True

    def __init__(self, head: Eagle3Head, embed: torch.nn.Embedding, vocab_size: int, max_total_tokens: int,
                 output_head=None):
        """output_head: the target's `compute_logits` for a head that guesses features, not tokens (EAGLE-1);
        None: the head's own output head over its draft vocabulary (EAGLE-3)."""
        self.head = head
        self.embed = embed                          # the target's embedding (the head has none of its own)
        self.vocab_size = vocab_size
        self.kv = KVManager(head, max_total_tokens)
        self.target_hidden = tuple(head.cfg.aux_layers)
        self.pending: dict[int, _Pending] = {}
        self.fed: dict[int, int] = {}               # positions cached with target states
        self.d2t = head.draft_to_target             # [draft_vocab] target ids
        self.dtype = head.dtype
        self.logits = output_head or head.compute_logits      # h [N, H] -> [N, draft_vocab] fp32

    def accept_hidden(self, seq_id: int, start: int, hidden: dict[int, torch.Tensor]) -> None:
        rows = torch.cat([hidden[i] for i in self.target_hidden], -1)          # [n, 3H]
        self.pending.setdefault(seq_id, _Pending(start)).add(start, rows)

    @torch.inference_mode()
    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        drafted: list[list[int]] = [[] for _ in ctxs]
        tree_parents: list[list[int] | None] = [None] * len(ctxs)
        q_rows: list[list[torch.Tensor]] = [[] for _ in ctxs]
        owners, feeds = [], []                      # (kv, start, token ids, target states, seq id) per drafting seq
        for i, (ctx, k) in enumerate(zip(ctxs, ks)):
            if k <= 0:
                continue
            n = len(ctx.token_ids)
            fed = self.fed.get(ctx.seq_id, 0)
            pend = self.pending.get(ctx.seq_id)
            if pend is not None and pend.start < fed:    # resumed from a prefix entry: re-fed from the target's states
                fed = pend.start
            # the rows to feed: positions fed .. n-2, each with the token after it (the newest token is n-1)
            if pend is None or pend.start != fed or fed + pend.count != n - 1:
                continue                             # states missing (cannot happen in the engine): no draft
            kv = self.kv.ensure(ctx.seq_id, n - 1 + (k if not ctx.tree else 1 + (ctx.depth - 1) * ctx.topk))
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
        trees = [j for j in range(len(owners)) if ctxs[owners[j]].tree]
        if trees:
            built = self._draft_trees([ctxs[owners[j]] for j in trees], [ks[owners[j]] for j in trees], h_last[trees],
                                      [feeds[j] for j in trees])
            for j, (tokens, parents) in zip(trees, built):
                drafted[owners[j]] = tokens
                tree_parents[owners[j]] = parents
        active = [j for j in range(len(owners)) if not ctxs[owners[j]].tree]
        while active:
            logits = self.logits(h_last[active])                                    # [A, V'] draft vocabulary
            nxt = []
            for row, j in enumerate(active):
                i = owners[j]
                tok = head_draft_token(logits[row: row + 1], self.d2t, self.head.cfg.vocab_size, self.vocab_size,
                                       ctxs[i], q_rows[i])
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
        return [Draft(torch.tensor(d, dtype=torch.long), torch.stack(q) if q else None, t)
                for d, q, t in zip(drafted, q_rows, tree_parents)]

    def _draft_trees(self, ctxs: list[ProposalContext], budgets: list[int], h_root: torch.Tensor,
                     feeds: list[tuple]) -> list[tuple[list[int], list[int]]]:
        """EAGLE-2 trees for greedy sequences: h_root [S, H] the head's state after each one's newest token."""
        device = h_root.device
        builders = [TreeBuilder(ctx.topk) for ctx in ctxs]
        for b, (lp, tok) in zip(builders, self._top(h_root, [ctx.topk for ctx in ctxs])):
            b.add_top(-1, lp, tok)
        h_of: dict[tuple[int, int], torch.Tensor] = {}                              # (seq, node) -> h of its parent
        for s, b in enumerate(builders):
            for i in range(len(b.nodes)):
                h_of[(s, i)] = h_root[s]
        for depth in range(1, max(ctx.depth for ctx in ctxs)):
            # a level is grown only where some node it grows from could still be verified (no head forward for
            # rows whose subtrees the cost model would cut anyway)
            grow = [(s, b.frontier) for s, (b, ctx, k) in enumerate(zip(builders, ctxs, budgets))
                    if depth < ctx.depth and b.pick_frontier(depth) and b.worth_growing(k, ctx.row_cost)]
            if not grow:
                break
            spans, toks, gs, positions, rows = [], [], [], [], []
            for s, frontier in grow:
                kv, b = feeds[s][0], builders[s]
                prefix, start = self.fed[feeds[s][4]], kv.length                    # committed rows; first free slot
                paths = []
                for r, node in enumerate(frontier):
                    b.nodes[node].slot = start + r
                    paths.append([b.nodes[a].slot for a in b.path(node)])
                    toks.append(b.nodes[node].token)
                    gs.append(h_of[(s, node)])
                    positions.append(prefix + depth - 1)
                    rows.append((s, node))
                spans.append((kv, start, len(frontier), True, tree_keys(paths, prefix)))
            attn = causal_metadata(spans, device=device)
            h = self.head(self.embed(torch.tensor(toks, dtype=torch.long, device=device)), torch.stack(gs),
                          torch.tensor(positions, device=device), attn)              # [rows, H]
            for (_, start, t, *_), (s, _) in zip(spans, grow):
                self.kv.commit(feeds[s][4], start + t)
            top = self._top(h, [builders[s].topk for s, _ in rows])
            for (s, node), (lp, tok), h_row in zip(rows, top, h):
                first = len(builders[s].nodes)
                builders[s].add_top(node, lp, tok)
                for i in range(first, len(builders[s].nodes)):
                    h_of[(s, i)] = h_row
        return [b.select(k, ctx.row_cost) for b, k, ctx in zip(builders, budgets, ctxs)]

    def _top(self, h: torch.Tensor, topks: list[int]) -> list[tuple[list[float], list[int]]]:
        """Per row of h [R, H], its topks[r] likeliest draft tokens as (log-probabilities, target ids), best first:
        one log-softmax and one top-k over all rows, one copy out (not a few small ops per node)."""
        logp = torch.log_softmax(self.logits(h), -1)                                # [R, V']
        lp, idx = logp.topk(max(topks), -1)                                         # [R, topk]
        lps, toks = lp.tolist(), self.d2t[idx].tolist()
        return [(a[:n], b[:n]) for a, b, n in zip(lps, toks, topks)]

    # prefix caching: an entry keeps the rows fed with target states (not the last step's draft rows); a sequence
    # that resumes from it copies them, and the scheduler starts its prefill no later than where they end
    def export_cache(self, seq_id: int):
        if seq_id in self.kv.caches:
            self.kv.truncate(seq_id, self.fed.get(seq_id, 0))
        return self.kv.pop(seq_id)

    def import_cache(self, seq_id: int, source, positions: int) -> None:
        self.fed[seq_id] = self.kv.adopt_extra(seq_id, source, positions)

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


def _build_eagle3(ctx: BuildContext) -> Eagle3Proposer | None:
    head = (ctx.heads or {}).get(EAGLE3.name)
    return None if head is None else Eagle3Proposer(head, ctx.target.embed_tokens, ctx.vocab_size,
                                                    ctx.max_total_tokens)


def _build_eagle(ctx: BuildContext) -> Eagle3Proposer | None:
    """EAGLE-1: the same drafting, through the target's output head (its head guesses features, not tokens)."""
    head, target = (ctx.heads or {}).get(EAGLE.name), ctx.target
    if head is None:
        return None
    return Eagle3Proposer(head, target.embed_tokens, ctx.vocab_size, ctx.max_total_tokens,
                          output_head=lambda h: target.compute_logits(h)[:, :head.cfg.vocab_size])


EAGLE3 = Method(Eagle3Head.method, 4, "head", prior_alpha=0.5, tree=True, trainable=True, needs="head",
                build=_build_eagle3,
                summary="EAGLE-3: a one-layer head over three of the target's layers' hidden states (chains or "
                        "token trees)")
EAGLE = Method(EagleHead.method, 4, "head", prior_alpha=0.5, tree=True, needs="head", build=_build_eagle,
               summary="EAGLE-1/2 heads (vLLM's and the authors' layouts), drafting through the target's output "
                       "head")
