"""Attention metadata of one forward: per sequence, where its rows are in the flat batch, where its new tokens go in
its cache, and its mask. Built once per step outside the layers (a tree-shaped draft is just another mask).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_cache import SeqKV


@dataclass
class SeqAttn:
    kv: SeqKV
    start: int                   # cache position of the sequence's first new token in this forward
    num_tokens: int              # T: its new tokens (rows of the flat batch)
    query_start: int             # its first row in the flat batch
    key_len: int                 # keys attended (start + T, padded to the key block; padding is masked)
    mask: torch.Tensor | None    # [rows, key_len] bool, rows >= T (zero-padded queries); None = no mask needed


@dataclass
class AttnMetadata:
    seqs: list[SeqAttn]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)


def causal_metadata(spans: list[tuple[SeqKV, int, int]], min_query_rows: int = 1, key_block: int = 1,
                    device: torch.device | str | None = None) -> AttnMetadata:
    """spans: (kv, start, num_tokens) per sequence, in flat-batch order -> causal AttnMetadata.

    Query i of a sequence (position start+i) sees keys 0..start+i. With `min_query_rows` > 1 or `key_block` > 1
    (bf16 on CPU), every sequence's attention runs over at least that many query rows and over keys padded to a
    multiple of the block, so a one-token step and a (k+1)-token verification take the same kernel paths and give
    bit-identical rows (see models/packed_linear.py). The caller sizes each cache to hold `key_len` positions.
    """
    seqs, row = [], 0
    for kv, start, t in spans:
        end = start + t
        rows = max(t, min_query_rows)
        key_len = -(-end // key_block) * key_block if key_block > 1 else end
        mask = None
        if rows > 1:
            mask = torch.zeros(rows, key_len, dtype=torch.bool, device=device)
            mask[:, :end] = torch.ones(rows, end, dtype=torch.bool, device=device).tril(start)
        seqs.append(SeqAttn(kv, start, t, row, key_len, mask))
        row += t
    return AttnMetadata(seqs)
