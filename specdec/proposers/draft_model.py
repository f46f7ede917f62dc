"""A smaller model of the same family drafts k tokens autoregressively, for many sequences at once; for greedy
requests that ask for one (eagle_topk > 1), a token tree grown level by level in the same batched forwards."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..errors import SpecDecError
from ..models.kv_cache import SeqKV
from ..models.kv_manager import KVManager
from ..models.qwen2 import Transformer
from ..models.runner import Span, forward_spans
from ..tokenizer import Tokenizer
from .base import BuildContext, Draft, ProposalContext, Proposer, VerifyResult, draft_token, head_draft_token
from .method import Method
from .tree import TreeBuilder

DECODE_ROWS = 16     # catch-up spans up to this many tokens run as decode rows (row-by-row attention)
# A cut head's ranking was counted on English text and code: a sequence that writes in another script finds most of
# its tokens outside the cut (a Chinese answer 0.28 inside it), so once this share of its tokens, and at least
# WHOLE_HEAD_MIN of them, are non-ASCII ones the cut lacks (Chinese or Korean prompts 0.18-0.59, Portuguese 0.05;
# English and code, names and typographic quotes included, under 0.02 of 281 ShareGPT and benchmark prompts, one
# English note full of French names 0.042) it drafts from the whole head (docs/benchmarks/draft-vocab, "Prose in
# another script").
WHOLE_HEAD_SHARE = 0.03
WHOLE_HEAD_MIN = 4          # a short English prompt with one accented name stays on the cut


def check_compatible(target_tok: Tokenizer, draft_tok: Tokenizer, target_vocab: int, draft_vocab: int) -> None:
    """Refuse a draft whose tokens mean something else to the target (llama.cpp's are_compatible)."""
    if target_tok.vocab_size != draft_tok.vocab_size:
        raise SpecDecError(f"draft and target vocabularies differ: target tokenizer has {target_tok.vocab_size} "
                           f"tokens, draft has {draft_tok.vocab_size}")
    if sorted(target_tok.eos_token_ids) != sorted(draft_tok.eos_token_ids):
        raise SpecDecError(f"draft and target special tokens differ: eos {target_tok.eos_token_ids} vs "
                           f"{draft_tok.eos_token_ids}")
    if target_tok.bos_token_id != draft_tok.bos_token_id:
        raise SpecDecError(f"draft and target special tokens differ: bos {target_tok.bos_token_id} vs "
                           f"{draft_tok.bos_token_id}")
    if min(target_vocab, draft_vocab) < target_tok.vocab_size:
        raise SpecDecError(f"model output heads ({target_vocab}, {draft_vocab}) are smaller than the "
                           f"tokenizer vocabulary ({target_tok.vocab_size})")
    tv, dv = target_tok.vocab(), draft_tok.vocab()
    if tv != dv:
        diff = min(t for t in tv.keys() | dv.keys() if tv.get(t) != dv.get(t))
        raise SpecDecError(f"draft and target token text differs: token {diff!r} is id {tv.get(diff)} in the "
                           f"target and id {dv.get(diff)} in the draft")


def catch_up(kv_manager: KVManager, seq_id: int, kv: SeqKV, missing: list[int], budget: int, spans: list,
             owners: list) -> int:
    """A sequence whose draft cache lacks more than the step's catch-up budget (a long prompt) is fed a chunk of
    what it lacks (at most the budget, never all: the last token is fed with the step that drafts) and drafts
    nothing this step: its span joins the step's spans (owner None); returns the budget left."""
    n = max(0, min(budget, len(missing) - 1))
    if n:
        kv_manager.ensure(seq_id, kv.length + n)
        spans.append(Span(kv, kv.length, missing[:n], "none"))
        owners.append(None)
    return budget - n


def unsure(logits: torch.Tensor, ctx: ProposalContext, q_rows: list) -> bool:
    """Whether the chain stops after this token: the draft's distribution gave its likeliest token less than
    ctx.p_min (a sampled request's q_draft, else the softmax of the logits [1, columns]).

    On the pair's answers the draft's token was the target's 0.22-0.55 of the time where it gave it under 0.6, and
    always where it gave it 0.95 or more (docs/benchmarks/draft-confidence): a chain that runs on while the draft is
    sure and stops after the first token it is not, replayed, committed 1.085x the tokens per unit of time of the best
    fixed k. The stop reads the draft's own tokens and distributions only, so each verified position is still
    accepted or resampled exactly."""
    if ctx.p_min <= 0.0:
        return False
    top = q_rows[-1].max() if q_rows else torch.softmax(logits.float(), -1).max()
    return float(top) < ctx.p_min


class DraftModelProposer(Proposer):
    """Drafts for every sequence of a step in shared batched forwards of the draft model.

    Each sequence's draft cache (held by a KV manager, like the target's) is a prefix of its committed tokens. The
    engine feeds it the prompt of a request of method draft, chunk by chunk, in the steps that prefill the target
    (`prefill`); a request whose step controller picks the draft per step (auto) has it read the prompt when a step
    first picks the draft, by the catch-up below. The first forward of
    a step feeds every sequence the committed tokens its cache lacks (the newest token; after a fully accepted draft,
    the last draft token and the bonus token; the prompt when it was not fed during prefill) and yields its first
    draft token; each further forward feeds one row per sequence still drafting. A sequence more than `catchup_budget`
    tokens behind (a long prompt) only catches up by a chunk this step and drafts nothing, so no step carries an
    unbounded draft prefill. After verification `observe` truncates the cache to the committed prefix (O(1)).
    """
    name = "draft"

    def __init__(self, model: Transformer, vocab_size: int, kv, catchup_budget: int = 512,
                 tokenizer: Tokenizer | None = None):
        self.model = model
        self.vocab_size = vocab_size                 # compare on the shared vocabulary
        self.kv = kv                                 # models.kv_manager.KVManager over the draft model
        self.catchup_budget = catchup_budget
        self.tree_base: dict[int, int] = {}          # seq_id -> committed tokens before its last tree
        # [V'] the token of each row of a head cut to the tokens the target emits (FR-Spec); None: the whole vocabulary
        self.output_ids = model.output_ids
        self.extra: dict[int, ContextRows] = {}     # seq_id -> its own tokens outside the cut, drafted from too
        self.tokenizer = tokenizer                   # tells which tokens are not ASCII text (None: never whole)
        self.foreign: dict[int, bool] = {}           # token outside the cut -> whether its bytes are not ASCII
        self.whole_head = None                       # the whole head's linear, made when a sequence first needs it
        self.whole_head_sequences = 0
        self.timing: tuple[int, int, float] | None = None   # the last propose's: see take_timing
        if self.output_ids is not None:
            self.kept = bytearray(max(vocab_size, int(self.output_ids.max()) + 1))
            for t in self.output_ids.tolist():
                self.kept[t] = 1

    @torch.inference_mode()
    def prefill(self, chunks: list[tuple[int, int, list[int]]]) -> None:
        """Feed prompt chunks (seq_id, start, token_ids) to the draft in the step that prefills them in the target,
        in one forward, so that a long prompt's draft prefill is paid before the first token instead of by the
        decode steps after it. A chunk that does not continue the draft's cache (a sequence that joined the draft
        mid-way) is left to `propose`'s catch-up; one whose start the cache already holds (a prefix cache hit
        reused more of the draft's K/V than of the target's) feeds only what the cache lacks."""
        spans = []
        for seq_id, start, ids in chunks:
            kv = self.kv.get(seq_id)
            if start < kv.length:
                ids, start = ids[kv.length - start:], kv.length
            if kv.length != start or not ids or self.kv.extra_needed(seq_id, start + len(ids)) > self.kv.free:
                continue                 # no room now: propose() catches up later
            self.kv.ensure(seq_id, start + len(ids))
            spans.append(Span(kv, start, ids, "none"))
        if spans:
            forward_spans(self.model, spans)
            for span in spans:
                span.kv.length = span.start + len(span.token_ids)

    @torch.inference_mode()
    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        start = time.perf_counter()
        drafted: list[list[torch.Tensor]] = [[] for _ in ctxs]
        q_rows: list[list[torch.Tensor]] = [[] for _ in ctxs]
        trees: dict[int, TreeBuilder] = {}           # greedy requests asking for a tree (eagle_topk > 1)
        spans, owners = [], []
        budget = self.catchup_budget
        for i, (ctx, k) in enumerate(zip(ctxs, ks)):
            if k <= 0:
                continue
            ids = ctx.token_ids
            kv = self.kv.get(ctx.seq_id)
            if kv.length >= len(ids):                 # the newest token must be fed to draft after it
                self.kv.truncate(ctx.seq_id, len(ids) - 1)
            missing = ids[kv.length:]                 # committed tokens the draft has not seen (>= 1)
            if len(missing) > max(budget, 1):           # catch up by a chunk; no draft for this sequence this step
                budget = catch_up(self.kv, ctx.seq_id, kv, missing, budget, spans, owners)
                continue
            budget -= len(missing)
            if ctx.tree:
                trees[i] = TreeBuilder(ctx.topk)
                self.tree_base[ctx.seq_id] = len(ids)
            # a tree's expanded nodes take a slot each (at most topk a level) after the committed tokens
            self.kv.ensure(ctx.seq_id, len(ids) + (ctx.topk * ctx.depth if ctx.tree else k))
            # a few new tokens take the decode path (the draft's rows need no exactness; this is about speed)
            rows = self.context_rows(ctx.seq_id, ids)
            spans.append(Span(kv, kv.length, missing, self._logits_of(rows, "last"),
                              decode=len(missing) <= DECODE_ROWS, hidden=rows is not None))
            owners.append((i, None))
        # timed for the policy's clock only where the step is what c prices: one sequence's chain, no prompt read
        timed = len(spans) == 1 and owners[0] is not None and not trees and spans[0].decode
        forwards, context = 0, spans[0].start if timed else 0
        while spans:
            forwards += 1
            logits, hidden = self._forward(spans)
            nxt, nxt_owners = [], []
            for span, owner, lg, h in zip(spans, owners, logits, hidden):
                # what this forward wrote is now cached (a tree level: its slots, after the levels before it)
                span.kv.length = max(span.kv.length, span.start + len(span.token_ids))
                if owner is None:
                    continue
                i, nodes = owner
                lg, token_ids = self.columns(ctxs[i].seq_id, lg, h, len(span.token_ids) if nodes is not None else 1)
                if i in trees:
                    grow = self._grow_tree(trees[i], ctxs[i], ks[i], span.kv, lg, token_ids, nodes)
                    if grow is not None:
                        nxt.append(grow)
                        nxt_owners.append((i, trees[i].frontier))
                    continue
                tok = self._token(lg, token_ids, ctxs[i], q_rows[i])
                drafted[i].append(tok)
                if len(drafted[i]) < ks[i] and not unsure(lg, ctxs[i], q_rows[i]):
                    nxt.append(Span(span.kv, span.kv.length, [tok], span.logits, decode=True, hidden=span.hidden))
                    nxt_owners.append((i, None))
            spans, owners = nxt, nxt_owners
        self.timing = (forwards, context, time.perf_counter() - start) if timed else None
        for ctx in ctxs:                          # the grammar state goes back to the committed tokens
            if ctx.constraint is not None:
                ctx.constraint.rollback_draft()
        out = []
        for i, (d, q) in enumerate(zip(drafted, q_rows)):
            if i in trees:
                tokens, parents = trees[i].select(ks[i], ctxs[i].row_cost)
                out.append(Draft(torch.tensor(tokens, dtype=torch.long), None, parents))
            else:
                # the cache holds the committed tokens + the draft but the last (fed next time if accepted)
                out.append(Draft(torch.tensor(d, dtype=torch.long), torch.stack(q) if q else None))
        return out

    def take_timing(self) -> tuple[int, int, float] | None:
        timing, self.timing = self.timing, None
        return timing

    def context_rows(self, seq_id: int, token_ids: list[int]) -> ContextRows | None:
        """The sequence's own tokens that a cut head lacks (its prompt's rare words and names, which a draft copies
        well), as rows drafted from beside the cut; brought up to date with the tokens committed since the last
        step. A sequence that writes in a script the cut hardly holds gets the whole head instead
        (WHOLE_HEAD_SHARE). None: the head is whole, or it holds every token of the sequence."""
        if self.output_ids is None:
            return None
        rows = self.extra.get(seq_id)
        if rows is None:
            rows = self.extra[seq_id] = ContextRows()
        if rows.whole:
            return rows
        outside = [t for t in token_ids[rows.seen:] if t < self.vocab_size and not self.kept[t]]
        rows.seen = len(token_ids)
        rows.foreign += sum(self._foreign(t) for t in outside)
        if rows.foreign >= max(WHOLE_HEAD_MIN, WHOLE_HEAD_SHARE * len(token_ids)):
            return self._whole(rows)
        new = [t for t in outside if t not in rows.ids]
        if new:
            rows.ids.update(new)
            extra = torch.tensor(sorted(rows.ids), dtype=torch.long)
            rows.linear = self.model.output_rows.linear(extra)
            rows.token_ids = torch.cat([self.output_ids, extra.to(self.output_ids.device)])
        return rows if rows.ids else None

    def _foreign(self, token: int) -> bool:
        """Whether a token outside the cut is text in another script than ASCII's (cached per token)."""
        if self.tokenizer is None:
            return False
        known = self.foreign.get(token)
        if known is None:
            known = self.foreign[token] = not self.tokenizer.token_bytes(token).isascii()
        return known

    def _whole(self, rows: ContextRows) -> ContextRows:
        """The sequence drafts from every row of the head from now on (its columns: the whole vocabulary in order;
        the cut's logits of its forward are left unused)."""
        if self.whole_head is None:                  # shared by every such sequence, made once
            self.whole_head = self.model.output_rows.whole()
        rows.whole, rows.linear, rows.token_ids, rows.ids = True, self.whole_head, None, set()
        self.whole_head_sequences += 1
        return rows

    def _forward(self, spans: list[Span]) -> tuple[list, list]:
        """forward_spans, with each span's final hidden states where it asked for them (its sequence's own rows)."""
        if not any(s.hidden for s in spans):
            return forward_spans(self.model, spans), [None] * len(spans)
        last = self.model.config.num_layers
        logits, hidden = forward_spans(self.model, spans, aux_layers=(last,))
        return logits, [h[last] if h is not None else None for h in hidden]

    @staticmethod
    def _logits_of(rows: ContextRows | None, wanted: str) -> str:
        """The rows a span asks the model's (cut) head for: none where the sequence drafts from the whole head,
        whose logits columns() computes from the hidden states (the cut head's would be dropped)."""
        return "none" if rows is not None and rows.whole else wanted

    def columns(self, seq_id: int, logits: torch.Tensor | None, hidden: torch.Tensor | None, n: int = 1):
        """(logits, the token of each of its columns): a cut head's logits followed by the sequence's own rows, or
        the whole head's for the hidden states' last `n` rows (logits None: the span asked the cut head for none)."""
        if self.output_ids is None:
            return logits[:, : self.vocab_size], None
        rows = self.extra.get(seq_id)
        if hidden is None or rows is None or rows.linear is None:
            return logits, self.output_ids
        n = n if logits is None else logits.shape[0]                  # the rows the logits are for: the last ones
        own = rows.linear(hidden[-n:]).float()
        if rows.whole:
            return own[:, : self.vocab_size], None
        return torch.cat([logits, own], dim=-1), rows.token_ids

    def _token(self, logits: torch.Tensor, token_ids: torch.Tensor | None, ctx: ProposalContext, q_rows: list) -> int:
        """The next draft token from the draft's logits [1, columns] (column j: token token_ids[j]; None: the whole
        vocabulary in order). A cut head's q is its distribution over the tokens it has (zero elsewhere): the
        verifier's residual max(0, p_target - q_draft) covers the rest, so the output stays the target's."""
        if token_ids is None:
            return draft_token(logits, ctx, q_rows)
        return head_draft_token(logits, token_ids, self.model.config.vocab_size, self.vocab_size, ctx, q_rows)

    def _grow_tree(self, b: TreeBuilder, ctx: ProposalContext, k: int, kv: SeqKV, logits: torch.Tensor,
                   token_ids: torch.Tensor | None, nodes: list[int] | None) -> Span | None:
        """Add the children of the rows just computed (nodes; None: the newest committed token) and return the span
        that grows the tree's next level, or None when it is done: `depth` levels deep, or no frontier node could be
        kept at the size V(rows, context) makes best (the tree branches where the draft's top-1 is unsure: a
        confident top-1 leaves its siblings too unlikely to keep)."""
        logp = torch.log_softmax(logits.float(), -1)
        lp, idx = logp.topk(b.topk, -1)
        if token_ids is not None:
            idx = token_ids[idx]
        for node, a, t in zip(nodes if nodes is not None else [-1], lp.tolist(), idx.tolist()):
            b.add_top(node, a, t)
        depth = 1 if nodes is None else b.nodes[nodes[0]].depth + 1
        if depth >= ctx.depth or not b.pick_frontier(depth) or not b.worth_growing(k, ctx.row_cost):
            return None
        start, base = kv.length, self.tree_base[ctx.seq_id]
        for r, node in enumerate(b.frontier):
            b.nodes[node].slot = start + r
        paths = [[b.nodes[a].slot for a in b.path(node)] for node in b.frontier]
        rows = self.extra.get(ctx.seq_id)
        return Span(kv, start, [b.nodes[n].token for n in b.frontier], self._logits_of(rows, "all"), decode=True,
                    paths=paths, tree_base=base, hidden=rows is not None and rows.linear is not None)

    def observe(self, result: VerifyResult) -> None:
        kv = self.kv.caches.get(result.seq_id)
        # keep only committed tokens (the newest committed token is fed at the next propose); after a tree, only
        # those before it: its nodes sit in expansion order, not at their positions, so the accepted ones are fed
        # again with the next step's first rows
        keep = min(result.committed_len - 1, self.tree_base.pop(result.seq_id, result.committed_len))
        if kv is not None and kv.length > keep:
            self.kv.truncate(result.seq_id, keep)

    def status(self) -> dict:
        """The rows of the draft's output head (its vocabulary where the head was cut), and the bits of its MLP
        codes where its linears are block-quantized (draft_mlp_bits)."""
        out = {"draft_vocab_size": self.vocab_size if self.output_ids is None else len(self.output_ids)}
        if self.output_ids is not None:
            out["draft_whole_head_sequences"] = self.whole_head_sequences   # since start (see WHOLE_HEAD_SHARE)
        bits = getattr(getattr(self.model.layers[0].mlp.down_proj, "packed", None), "bits", None)
        if bits is not None:
            out["draft_mlp_bits"] = bits
        return out

    def release(self, seq_id: int) -> None:
        self.tree_base.pop(seq_id, None)
        self.extra.pop(seq_id, None)
        self.kv.free_seq(seq_id)

    def export_cache(self, seq_id: int) -> SeqKV | None:
        return self.kv.pop(seq_id)

    def cache_of(self, seq_id: int) -> SeqKV | None:
        return self.kv.caches.get(seq_id)

    def import_cache(self, seq_id: int, source: SeqKV, positions: int) -> None:
        self.kv.adopt_extra(seq_id, source, positions)

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_nbytes()

    @property
    def cache_bytes(self) -> int:
        return self.kv.nbytes


@dataclass
class ContextRows:
    """A sequence's own tokens outside a cut head, and the head's rows for them."""
    seen: int = 0                                       # its tokens checked so far
    foreign: int = 0                                    # of them: non-ASCII tokens outside the cut
    whole: bool = False                                 # drafting from the whole head (linear: all its rows)
    ids: set[int] = field(default_factory=set)
    linear: torch.nn.Module | None = None               # hidden -> logits of those tokens (ascending ids)
    token_ids: torch.Tensor | None = None               # the cut head's tokens, then those


def _build(ctx: BuildContext) -> DraftModelProposer | None:
    if ctx.draft_model is None or ctx.draft_tokenizer is not None:     # another vocabulary: cross_vocab's
        return None
    return DraftModelProposer(ctx.draft_model, ctx.vocab_size, KVManager(ctx.draft_model, ctx.max_total_tokens),
                              ctx.max_batched_tokens, ctx.target_tokenizer)


# k 4: the 0.5B draft's step costs ~a third of the target's, so its gain peaks at k=4 (docs/tuning.md)
METHOD = Method("draft", 4, "model", prior_alpha=0.8, tree=True, needs="draft_model", build=_build,
                draft_default=True,
                summary="a smaller model of the same family drafts k tokens autoregressively (a token tree with "
                        "eagle_topk > 1)")
