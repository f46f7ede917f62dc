"""Attention metadata of one forward: per sequence, where its rows are in the flat batch, where its new tokens go in
its cache, and which keys each row attends over. Built once per step outside the layers (a tree-shaped draft is
just another mask).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from .kv_cache import SeqKV


@dataclass
class AttnRun:
    """Consecutive query rows of one sequence that attend over the same (padded) key range in one kernel call."""
    first: int                   # its first row among the sequence's new tokens
    num_rows: int
    key_len: int                 # keys attended (padded to the key block; padding is masked)
    mask: torch.Tensor | None    # [rows, key_len] bool, rows >= num_rows (zero-padded queries); None = no mask needed
    decode: bool = False         # generated tokens: the compiled attention runs them row by row over exactly their
                                 # keys (key_len, mask and padding then only serve the eager fallback)
    tree: torch.Tensor | None = None   # a token tree's rows (decode): int64 [rows, 1 + W], per row the number of
                                 # leading cache slots it sees, then its path's slots (ancestors, itself; -1 padded)


@dataclass
class SeqAttn:
    kv: SeqKV
    start: int                   # cache position of the sequence's first new token in this forward
    num_tokens: int              # T: its new tokens (rows of the flat batch)
    query_start: int             # its first row in the flat batch
    runs: list[AttnRun]

    @property
    def key_len(self) -> int:    # the cache positions the forward touches (the caller sizes the cache for them)
        return max(r.key_len for r in self.runs)


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool mask as scaled_dot_product_attention turns it into one per call (0 where allowed, -inf where not, in
    the query's dtype), made once per forward instead of once per layer; the attention is the same."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


@dataclass
class AttnMetadata:
    seqs: list[SeqAttn]
    local: AttnMetadata | None = None   # WindowedKV caches: the same rows over the local layers' spans

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)

    @property
    def max_position(self) -> int:
        """The largest position written in this forward (sizes the rotary tables without a device sync)."""
        return max(s.start + s.num_tokens for s in self.seqs) - 1

    @cached_property
    def per_seq_lists(self) -> tuple[list, ...]:
        """The metadata in the form the compiled ragged attention takes, built once per forward for every layer:
        per sequence (k caches, v caches, starts, counts), then per run (sequence index, first row in the flat
        batch, rows, key length, additive mask, decode, tree key lists)."""
        seqs = self.seqs
        runs = [(i, s.query_start + r.first, r.num_rows, r.key_len,
                 None if r.decode else additive_mask(r.mask, s.kv.k.dtype), r.decode, r.tree)
                for i, s in enumerate(seqs) for r in s.runs]
        return ([s.kv.k for s in seqs], [s.kv.v for s in seqs], [s.start for s in seqs], [s.num_tokens for s in seqs],
                *map(list, zip(*runs)))


def _causal_run(start: int, first: int, num_rows: int, min_query_rows: int, key_len: int,
                device, decode: bool) -> AttnRun:
    # rows first .. first+num_rows-1 of a sequence whose new tokens start at cache position `start`:
    # row i (position start+i) sees keys 0..start+i
    rows = max(num_rows, min_query_rows)
    end = start + first + num_rows
    mask = None
    if rows > 1:
        mask = torch.zeros(rows, key_len, dtype=torch.bool, device=device)
        mask[:, :end] = torch.ones(rows, end, dtype=torch.bool, device=device).tril(start + first)
    return AttnRun(first, num_rows, key_len, mask, decode)


def tree_keys(paths: list[list[int]], prefix: int) -> torch.Tensor:
    """Key lists of token-tree rows: each row sees cache slots 0..prefix-1 and then the slots of its path (its
    speculative ancestors in depth order, then its own)  # int64 [rows, 1 + max path], -1 padded."""
    width = max(len(p) for p in paths)
    return torch.tensor([[prefix, *p, *([-1] * (width - len(p)))] for p in paths], dtype=torch.long)


def _tree_run(tree: torch.Tensor, key_len: int, device) -> AttnRun:
    # one decode run over every row of a tree; the bool mask (the same keys) serves the eager fallback
    rows = tree.shape[0]
    mask = torch.zeros(rows, key_len, dtype=torch.bool)
    for r, (prefix, *path) in enumerate(tree.tolist()):
        mask[r, :prefix] = True
        mask[r, [p for p in path if p >= 0]] = True
    return AttnRun(0, rows, key_len, mask.to(device), True, tree)


def causal_metadata(spans: list[tuple], min_query_rows: int = 1, key_block: int = 1,
                    device: torch.device | str | None = None) -> AttnMetadata:
    """spans: (kv, start, num_tokens), (kv, start, num_tokens, decode) or (kv, start, num_tokens, decode, tree) per
    sequence, in flat-batch order -> causal AttnMetadata; a span with a tree (see `tree_keys`) is one decode run of
    token-tree rows, each attending over its own key list.

    Decode rows (generated tokens: plain steps, verification rows) go to the compiled row-by-row attention on
    CPU, which is batch-invariant by construction: each row attends over exactly its own keys in a fixed order.
    Prompt rows (prefill chunks) go to ATen's flash attention, which pays a set-up per call but is fast over
    hundreds of rows; so that they too do not depend on the chunking, they are split into key-block runs below.
    The same runs and masks serve the eager fallback for both kinds (no compiled ops, or CUDA).

    Query i of a sequence (position start+i) sees keys 0..start+i. With `min_query_rows` > 1 or `key_block` > 1
    (bf16 on CPU) every row's attention runs over at least that many query rows and over its keys padded to the
    multiple of the block that holds its own position: rows whose positions fall in different key blocks go in
    separate runs (kernel calls). A row's attention then depends on its position only, not on how many rows share
    the forward or where a prompt was cut into chunks, so a one-token step and a (k+1)-token verification give
    bit-identical rows (see models/packed_linear.py). The caller sizes each cache for the largest key length.
    """
    seqs, row = [], 0
    for kv, start, t, *kind in spans:
        decode = bool(kind and kind[0])
        tree = kind[1] if len(kind) > 1 else None
        runs = []
        if tree is not None:
            key_len = -(-max(start + t, int(tree[:, 1:].max()) + 1) // key_block) * key_block
            runs.append(_tree_run(tree, key_len, device))
        elif key_block > 1:
            first = 0
            while first < t:
                key_len = -(-(start + first + 1) // key_block) * key_block     # the block holding this row's key
                n = min(t, key_len - start) - first                             # rows whose keys end in that block
                runs.append(_causal_run(start, first, n, min_query_rows, key_len, device, decode))
                first += n
        else:
            runs.append(_causal_run(start, 0, t, min_query_rows, start + t, device, decode))
        seqs.append(SeqAttn(kv, start, t, row, runs))
        row += t
    return AttnMetadata(seqs)
