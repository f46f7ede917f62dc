"""The one interface every proposer implements: propose drafts for a step's sequences, observe how they fared.

A proposer gets every sequence it drafts for in one call, so a model proposer can draft for all of them in shared
batched forwards (vLLM's flat draft batches); per-sequence proposers simply loop.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..models.kv_cache import SeqKV
from ..sampling.grammar import Constraint, apply_masks
from ..sampling.logits import probs_from_logits, sample
from ..sampling.penalties import Penalties, wants_penalties
from ..sampling_params import SamplingParams


@dataclass
class BuildContext:
    """What a method's `build` gets (Method.build): the target and whatever else the caller loaded."""
    target: torch.nn.Module                # the target Transformer (its embedding, output head, layer count)
    vocab_size: int                        # the target tokenizer's vocabulary (drafts are over it)
    max_total_tokens: int                  # the engine's KV budget (a proposer's own caches fit the same)
    max_batched_tokens: int                # the most prompt tokens one step prefills
    draft_model: torch.nn.Module | None = None         # the draft model, when one is loaded
    heads: dict[str, torch.nn.Module] | None = None    # learned heads loaded, by method
    target_tokenizer: object | None = None             # the target's Tokenizer
    draft_tokenizer: object | None = None              # set only for a draft with another vocabulary (cross_vocab)


@dataclass
class ProposalContext:
    """What a proposer may look at: the sequence so far and how it is sampled."""
    seq_id: int
    token_ids: list[int]                   # prompt + output so far (the last one not yet verified-in)
    params: SamplingParams
    generator: torch.Generator | None
    constraint: Constraint | None = None   # structured outputs: draft only what the grammar allows
    topk: int = 1                          # a token tree may branch this wide (heads; 1: draft a chain)
    depth: int = 0                         # ... and go this deep (0: k)
    # V(n), the target's forward over n rows relative to one (measured): sizes a tree; None: k nodes
    row_cost: Callable[[int], float] | None = None
    prompt_lookup_max: int = 4             # prompt lookup: the request's n-gram sizes (vLLM's names)
    prompt_lookup_min: int = 1
    corpus: str = "default"                # what suffix decoding searches beside the request: the outputs of its
                                           # pool and cache partition (`spec_pool#cache_salt`)
    prediction: list[int] | None = None    # the request's predicted output (OpenAI's `prediction`), as tokens
    penalties: Penalties | None = None     # the request's penalties and bias: a model drafts from the adjusted logits
    drafted: list[int] = field(default_factory=list)   # this proposal's tokens so far (what the penalties count)
    # methods auto and hybrid: the request's step controller (policy/decide.py), which picks each step's proposer
    # and k, and the step's budget (policy/cost_model.py's StepBudget: the rows the step carries so far), which it
    # sizes that choice by and adds it to; None for a fixed method
    controller: object | None = None
    budget: object | None = None
    # the draft model's chain stops after a token it gave less than p_min (0: it drafts the k it is asked for); the
    # stop reads the draft's own distribution only, so the verified output stays the target's
    p_min: float = 0.0

    @property
    def tree(self) -> bool:
        return tree_allowed(self.topk, self.params, self.constraint)


def tree_allowed(topk: int, params: SamplingParams, constraint) -> bool:
    """Draft a token tree: asked for (topk > 1), and the request is greedy and free of a grammar. A tree is verified
    by argmax, exact for greedy requests only, of a target whose rows do not depend on the path (penalties do); the
    others verify a chain as deep as the tree."""
    return topk > 1 and params.greedy and constraint is None and not wants_penalties(params)


@dataclass
class Draft:
    token_ids: torch.Tensor                # [k'] proposed tokens, k' <= k (0: nothing to propose)
    q_draft: torch.Tensor | None = None    # [k', V] the draft's (processed) probabilities; None = one-hot
    parents: list[int] | None = None       # a token tree (greedy only): node i's parent node, -1 for the newest
                                           # token; parents come before children. None: a chain
    source: str = ""                       # the method that made it, where a proposer drafted through another's

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def depth(self) -> int:
        """The most tokens verification can accept from it."""
        if self.parents is None:
            return len(self)
        depth: list[int] = []
        for p in self.parents:
            depth.append(1 + (depth[p] if p >= 0 else 0))
        return max(depth, default=0)

    def row_parents(self) -> list[int] | None:
        """Parents by verification row (row 0: the newest token, row i+1: node i), or None for a chain."""
        return None if self.parents is None else [-1] + [p + 1 for p in self.parents]


@dataclass
class VerifyResult:
    """What verification made of a draft; proposers may adapt to it."""
    seq_id: int
    num_draft: int
    num_accepted: int
    committed_len: int                     # tokens in the sequence after this step
    emitted: list[int] = field(default_factory=list)   # the tokens this step committed (accepted, then one more)


class Proposer(ABC):
    name: str = "base"
    # proposes without a forward (prompt lookup): the engine asks it while it plans the step, so the step's rows are
    # known before method auto's sequences choose theirs
    free: bool = False

    def match(self, ctx: ProposalContext, room: int) -> tuple[int, list[int]]:
        """A free proposer's continuation as a chain: (the length of the match it comes from, up to `room` tokens a
        grammar allows); (0, []) for none. What a combining method (hybrid) weighs against its model each step."""
        return 0, []

    @property
    def matches(self) -> bool:
        """Whether match() offers continuations: the step controller then weighs them beside a model at every step."""
        return type(self).match is not Proposer.match

    @abstractmethod
    def propose(self, ctxs: list[ProposalContext], ks: list[int]) -> list[Draft]:
        """For each sequence, up to ks[i] tokens to follow ctxs[i].token_ids (fewer, or none, is allowed)."""

    def prefill(self, chunks: list[tuple[int, int, list[int]]]) -> None:
        """Prompt chunks (seq_id, start, token_ids) the target prefills this step, for a proposer that must read the
        prompt itself (a draft model); a chunk may begin with tokens the proposer already read (skip those).
        Default: nothing to read."""

    def observe(self, result: VerifyResult) -> None:
        """Called after each verification (default: nothing to learn)."""

    def release(self, seq_id: int) -> None:
        """The sequence has finished; free anything kept for it."""

    def learn(self, corpus: str, prompt_ids: list[int], output_ids: list[int]) -> None:
        """A request of `corpus` finished with these tokens (suffix decoding keeps them; default: nothing)."""

    def take_timing(self) -> tuple[int, int, float] | None:
        """A draft model's last propose, when it drafted one sequence's chain in one-row forwards (no catch-up, no
        tree): (forwards, the context it started after, seconds), for method auto's clock; then cleared. Default:
        None (nothing timed)."""
        return None

    # prefix caching: a proposer with a cache of its own (a draft model) hands it over when a sequence ends, and
    # copies a later sequence's shared prefix from it
    def export_cache(self, seq_id: int) -> SeqKV | None:
        """Take the sequence's cache (positions 0..length-1 hold its tokens' K/V) for a prefix entry; None: none."""
        return None

    def cache_of(self, seq_id: int) -> SeqKV | None:
        """A running sequence's cache, to copy a shared prefix from (default: none kept)."""
        return None

    def import_cache(self, seq_id: int, source: SeqKV, positions: int) -> None:
        """Start the sequence's cache from the first `positions` of a prefix entry's cache (default: nothing)."""

    # True: a sequence resumes from a prefix entry only as far as this proposer's own cache in it reaches (a head
    # whose cache rows were fed the target's hidden states, which the entry does not keep)
    prefix_needs_cache: bool = False

    # learned heads read the target's hidden states: the layers they need (Transformer.forward's aux_layers), and
    # the committed rows' states after each forward
    target_hidden: tuple[int, ...] = ()

    def accept_hidden(self, seq_id: int, start: int, hidden: dict[int, torch.Tensor]) -> None:
        """The target's hidden states {layer: [n, H]} at committed positions start .. start+n-1 of a sequence."""

    # what /v1/speculative/status shows under the method, and a state file (Method.state_file) it keeps
    def status(self) -> dict:
        """The method's own section of /v1/speculative/status (default: nothing beyond the table's row)."""
        return {}

    def save(self, path: str) -> None:
        """Write the proposer's state to `path` atomically (a method with a state_file)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no state file")

    def load(self, path: str) -> None:
        """Read what `save` wrote."""
        raise NotImplementedError(f"{type(self).__name__} keeps no state file")

    @property
    def weight_bytes(self) -> int:
        return 0

    @property
    def cache_bytes(self) -> int:
        return 0


def empty_draft() -> Draft:
    return Draft(torch.empty(0, dtype=torch.long))


def draft_token(logits: torch.Tensor, ctx: ProposalContext, q_rows: list) -> int:
    """A model proposer's next draft token from its logits [1, V] over the target's vocabulary: the argmax for a
    greedy request, else a draw from the request's processed distribution (appended to q_rows: the q_draft that
    verification needs). A constrained sequence drafts from the grammar-masked distribution and advances it."""
    p, c = ctx.params, ctx.constraint
    if ctx.penalties is not None:
        logits = ctx.penalties.apply(logits, ctx.drafted)
    if c is not None:
        allowed = c.mask()[None]
        logits = apply_masks(logits, allowed)
        if not torch.isfinite(logits).any():    # a cut vocabulary that holds none of the allowed tokens: draft from
            logits = apply_masks(torch.zeros_like(logits), allowed)    # them uniformly (any q is exact if reported)
    if p.greedy:
        tok = int(logits.argmax(-1))
    else:
        q = probs_from_logits(logits, p.temperature, p.top_k, p.top_p, p.min_p)
        q_rows.append(q[0])
        tok = int(sample(q, ctx.generator))
    if c is not None:
        c.advance(tok)
    if ctx.penalties is not None:
        ctx.drafted.append(tok)
    return tok


def head_draft_token(logits: torch.Tensor, token_ids: torch.Tensor, model_vocab: int, vocab_size: int,
                     ctx: ProposalContext, q_rows: list) -> int:
    """draft_token for a head's logits over a reduced vocabulary [1, V'] (row j is target token token_ids[j]): the
    argmax, or a draw from the request's processed distribution computed over the V' rows only and scattered into a
    [vocab_size] q_draft row, zero elsewhere. That is the distribution the -inf-padded full row gives, without a
    152k-wide softmax and sort per draft token. A constrained request takes the full row (its grammar masks are over
    the target's vocabulary), and so does one with penalties (they count tokens over the whole vocabulary)."""
    if ctx.constraint is not None or ctx.penalties is not None:
        return draft_token(scatter_vocab(logits, token_ids, model_vocab, vocab_size), ctx, q_rows)
    if int(token_ids.max()) >= vocab_size:                          # a model's padding rows (ids >= vocab_size) go
        keep = token_ids < vocab_size
        logits, token_ids = logits[:, keep], token_ids[keep]
    p = ctx.params
    if p.greedy:
        return int(token_ids[int(logits.argmax(-1))])
    q_small = probs_from_logits(logits, p.temperature, p.top_k, p.top_p, p.min_p)         # [1, V']
    q = q_small.new_zeros(vocab_size)
    q[token_ids] = q_small[0]
    q_rows.append(q)
    return int(token_ids[int(sample(q_small, ctx.generator))])


def scatter_vocab(logits: torch.Tensor, token_ids: torch.Tensor, model_vocab: int, vocab_size: int) -> torch.Tensor:
    """A head's logits over a reduced vocabulary [R, V'] (row j is target token token_ids[j]) -> logits over the
    target's tokens [R, vocab_size], -inf for the tokens the head cannot propose (a model's padding rows dropped)."""
    full = logits.new_full((logits.shape[0], model_vocab), float("-inf"))
    full[:, token_ids] = logits
    return full[:, :vocab_size]
