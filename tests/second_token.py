"""The statistical check of a proposer's sampled outputs through the engine: the second generated token (the first one
speculated) of many seeded requests against its exact marginal under the target."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch

from specdec.models.runner import forward_once
from specdec.sampling.logits import probs_from_logits


def exact_marginal(model, prompt_ids: list[int], vocab: int, top_k: int = 5) -> torch.Tensor:
    """The second token's distribution under the target at temperature 1 and top-k: sum over the first token t0 of
    p(t0) p(t1 | t0) (top-k keeps it a small table)."""
    def probs(ids):
        return probs_from_logits(forward_once(model, ids)[-1:, :vocab], 1.0, top_k, 1.0, 0.0)[0]

    p0 = probs(prompt_ids)
    want = torch.zeros_like(p0)
    for t0 in p0.nonzero().flatten().tolist():
        want += p0[t0] * probs(prompt_ids + [t0])
    return want


def second_tokens(llm, prompt_ids, params, n, spec) -> torch.Tensor:
    """Counts of the second generated token over n seeded requests, 100 at a time through the engine."""
    counts = torch.zeros(llm.tokenizer.vocab_size)
    for start in range(0, n, 100):
        seqs = [llm.engine.add_request(f"s{start + i}", prompt_ids, replace(params, seed=start + i), spec)
                for i in range(100)]
        while llm.engine.has_unfinished():
            llm.engine.step()
        for seq in seqs:
            counts[seq.output_ids[1]] += 1
    return counts


@contextmanager
def second_token_proposals(proposer, prompt_len: int, vocab: int, check=None):
    """Yields counts [vocab] of the proposer's first draft token wherever it drafts the second generated token,
    filled as the engine runs; check(ctx, draft) sees each such draft."""
    proposed = torch.zeros(vocab)
    real = proposer.propose

    def spy(ctxs, ks):
        drafts = real(ctxs, ks)
        for ctx, d in zip(ctxs, drafts):
            if len(ctx.token_ids) == prompt_len + 1 and len(d):
                proposed[int(d.token_ids[0])] += 1
                if check is not None:
                    check(ctx, d)
        return drafts
    proposer.propose = spy
    try:
        yield proposed
    finally:
        del proposer.propose
