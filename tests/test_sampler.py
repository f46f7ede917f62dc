"""Exactness of the rejection sampler (RELIABILITY.md 1-3): the emitted tokens follow the target.

A vectorised generator runs 200k independent sequences: draft k tokens from q (which depends on the
previous token), verify against p (also prefix-dependent), append, repeat until every sequence has 3
tokens; then compare the empirical marginals at positions 1-3 with the target's exact marginals.
"""
import pytest
import torch

from specdec.sampling.logits import probs_from_logits
from specdec.sampling.rejection import PAD, verify_greedy, verify_sampling, verify_sampling_batch

V, N, POSITIONS, TV_BOUND = 24, 200_000, 3, 0.015


def _tables(seed, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0):
    g = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(V, V, generator=g) * 1.5       # row = previous token
    draft_logits = target_logits + torch.randn(V, V, generator=g) * 1.0   # a related but different draft
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    return probs_from_logits(target_logits, **kw), probs_from_logits(draft_logits, **kw)


def _run(P, Q, k, seed, sampler=verify_sampling_batch, use_q=True, p_row=None, q_row=None, q_told=None):
    """p_row(prev0, x): the target row verified after draft token x (default P[x]); prev0 is the token before
    the draft (structured outputs use it for a negative control). q_row(prev0, prev, j): the draft's distribution
    for draft position j (default Q[prev]; a Medusa head's depends on prev0 and j only). q_told: the distribution
    handed to verification instead of the one drawn from (negative controls)."""
    g = torch.Generator().manual_seed(seed)
    seqs = torch.full((N, POSITIONS), PAD, dtype=torch.long)
    filled = torch.zeros(N, dtype=torch.long)
    last = torch.zeros(N, dtype=torch.long)  # context token 0
    while (filled < POSITIONS).any():
        active = (filled < POSITIONS).nonzero().squeeze(-1)
        prev0 = prev = last[active]
        drafts, q_rows, p_rows = [], [], [P[prev]]
        for j in range(k):
            q = Q[prev] if q_row is None else q_row(prev0, prev, j)
            x = torch.multinomial(q, 1, generator=g).squeeze(-1)
            drafts.append(x); q_rows.append(q if q_told is None else q_told(prev0, prev, j)); p_rows.append(P[x] if p_row is None else p_row(prev0, x)); prev = x
        n, emitted = sampler(torch.stack(p_rows, 1), torch.stack(q_rows, 1) if use_q else None,
                             torch.stack(drafts, 1), g)
        for j in range(k + 1):
            take = (j <= n) & (filled[active] < POSITIONS)
            rows = active[take]
            seqs[rows, filled[rows]] = emitted[take, j]
            filled[rows] += 1
        last[active] = emitted[torch.arange(len(active)), n]
    return seqs


def _marginals(P):
    m = P[0]
    out = [m]
    for _ in range(POSITIONS - 1):
        m = m @ P
        out.append(m)
    return out


def _tv(seqs, P):
    expected = _marginals(P)
    return [0.5 * (torch.bincount(seqs[:, i], minlength=V).double() / N - expected[i].double()).abs().sum().item()
            for i in range(POSITIONS)]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_emitted_tokens_follow_target(k):
    P, Q = _tables(seed=k)
    assert all(tv < TV_BOUND for tv in _tv(_run(P, Q, k, seed=100 + k), P))


@pytest.mark.parametrize("processing", [dict(temperature=0.7), dict(temperature=1.3, top_k=6),
                                        dict(top_p=0.8), dict(min_p=0.1), dict(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05)])
def test_exact_under_logits_processing(processing):
    P, Q = _tables(seed=7, **processing)
    seqs = _run(P, Q, 3, seed=11)
    assert all(tv < TV_BOUND for tv in _tv(seqs, P))
    # every emitted token lies inside the target's mask
    for i, m in enumerate(_marginals(P)):
        assert (m[seqs[:, i]] > 0).all()


def test_ngram_one_hot_draft_is_exact():
    # a deterministic proposer: q is one-hot on the proposed token (here drawn from Q, passed as None)
    P, Q = _tables(seed=3)
    assert all(tv < TV_BOUND for tv in _tv(_run(P, Q, 3, seed=5, use_q=False), P))


def test_negative_control_always_accept_fails():
    def always_accept(p_target, q_draft, draft_tokens, generator):
        B, k = draft_tokens.shape
        bonus = torch.multinomial(p_target[:, k], 1, generator=generator)
        return torch.full((B,), k), torch.cat([draft_tokens, bonus], 1)

    P, Q = _tables(seed=3)
    assert max(_tv(_run(P, Q, 3, seed=5, sampler=always_accept), P)) > TV_BOUND


def test_negative_control_draft_not_from_q_fails():
    # verifying with the wrong q (claims tokens came from P when they came from Q) biases the output
    P, Q = _tables(seed=4)

    def wrong_q(p_target, q_draft, draft_tokens, generator):
        return verify_sampling_batch(p_target, p_target[:, :-1], draft_tokens, generator)

    assert max(_tv(_run(P, Q, 3, seed=6, sampler=wrong_q), P)) > TV_BOUND


def test_draft_equal_to_target_accepts_everything():
    P, _ = _tables(seed=9)
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(P[:4], 1, generator=g).squeeze(-1)     # [4] drafts
    p_rows = torch.cat([P[:4], P[4:5]])                          # [5, V]
    for _ in range(200):
        n, emitted = verify_sampling(p_rows, P[:4], x, g)
        assert n == 4 and emitted[:4].tolist() == x.tolist()


def test_disjoint_supports_reject_and_recover_from_target():
    p = torch.zeros(2, V); p[:, :4] = 0.25      # target lives on 0..3
    q = torch.zeros(1, V); q[0, 10] = 1.0        # draft lives on 10
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        n, emitted = verify_sampling(p, q, torch.tensor([10]), g)
        assert n == 0 and 0 <= int(emitted[0]) < 4
        assert not torch.isnan(emitted.float()).any()


def test_greedy_accepts_matching_prefix_then_recovers_or_adds_bonus():
    n, out = verify_greedy(torch.tensor([4, 7, 9, 2]), torch.tensor([4, 7, 1]))
    assert n == 2 and out.tolist() == [4, 7, 9]          # recovered token 9
    n, out = verify_greedy(torch.tensor([4, 7, 9, 2]), torch.tensor([4, 7, 9]))
    assert n == 3 and out.tolist() == [4, 7, 9, 2]       # bonus token 2
    n, out = verify_greedy(torch.tensor([5]), torch.tensor([], dtype=torch.long))
    assert n == 0 and out.tolist() == [5]


def test_seeded_verification_is_reproducible():
    P, Q = _tables(seed=1)
    a = _run(P[:, :], Q, 3, seed=42)
    b = _run(P[:, :], Q, 3, seed=42)
    assert torch.equal(a, b)


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = probs_from_logits(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, top_p=0.8)
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    probs = probs_from_logits(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, min_p=0.5)
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    probs = probs_from_logits(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, top_k=1)
    assert torch.allclose(probs, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_extreme_sampling_params_stay_valid():
    """Found by schemathesis: a denormal top_p or a tiny temperature must not produce nan/inf probabilities."""
    from specdec.sampling.logits import probs_from_logits
    from specdec.sampling_params import SamplingParams

    logits = torch.randn(3, 50) * 5
    for top_p in (5e-324, 1e-12, 0.3):
        p = probs_from_logits(logits, 1.0, top_p=top_p)
        assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(3))
    p = probs_from_logits(logits, 1.0, top_p=5e-324)
    assert (p.argmax(-1) == logits.argmax(-1)).all() and ((p > 0).sum(-1) == 1).all()
    assert SamplingParams(temperature=1e-300).greedy and not SamplingParams(temperature=0.01).greedy


def test_medusa_shaped_drafts_are_exact():
    """Medusa: draft j comes from head j's distribution given the verified prefix only, not the earlier guesses."""
    P, _ = _tables(21)
    heads = [probs_from_logits(torch.randn(V, V, generator=torch.Generator().manual_seed(30 + j)) * 1.5, 1.0)
             for j in range(3)]
    seqs = _run(P, None, 3, seed=22, q_row=lambda prev0, prev, j: heads[j][prev0])
    assert all(tv < TV_BOUND for tv in _tv(seqs, P))


def test_eagle3_reduced_vocabulary_drafts_are_exact():
    """EAGLE-3: the draft's distribution is zero outside its draft vocabulary; the tokens it can never propose
    still come out with the target's probabilities (through recovery)."""
    P, Q = _tables(23)
    inside = torch.zeros(V, dtype=torch.bool)
    inside[: V // 2] = True
    Qr = Q * inside
    Qr = Qr / Qr.sum(-1, keepdim=True)
    seqs = _run(P, Qr, 3, seed=24)
    assert all(tv < TV_BOUND for tv in _tv(seqs, P))
    assert (seqs >= V // 2).float().mean() > 0.2          # tokens outside the draft vocabulary do come out


def test_negative_control_medusa_q_of_another_head_fails():
    """Control: Medusa-shaped drafts drawn from head j but verified against head j+1's distribution are not exact,
    so the tests above can fail. (Verifying them as one-hot guesses would be exact: a random draft independent of
    the verification coin is a mixture of fixed guesses.)"""
    P, _ = _tables(21)
    heads = [probs_from_logits(torch.randn(V, V, generator=torch.Generator().manual_seed(30 + j)) * 1.5, 1.0)
             for j in range(3)]
    seqs = _run(P, None, 3, seed=26, q_row=lambda prev0, prev, j: heads[j][prev0],
                q_told=lambda prev0, prev, j: heads[(j + 1) % 3][prev0])
    assert max(_tv(seqs, P)) > TV_BOUND


@pytest.mark.parametrize("params", [dict(temperature=0.7), dict(temperature=1.0, top_k=5),
                                    dict(temperature=1.3, top_p=0.8), dict(temperature=1.0, min_p=0.2)])
def test_head_draft_token_draws_from_the_full_rows_distribution(params):
    """A head drafts over its reduced vocabulary (proposers.base.head_draft_token): its q_draft row is the one the
    -inf-padded full row gives, and its draws follow that row; a model's padding rows (ids >= vocab) never come out."""
    from specdec.proposers.base import ProposalContext, draft_token, head_draft_token, scatter_vocab
    from specdec.sampling_params import SamplingParams

    vocab, model_vocab = 100, 104
    ids = torch.cat([torch.randperm(vocab, generator=torch.Generator().manual_seed(3))[:39].sort().values,
                     torch.tensor([102])])                                  # 40 draft rows, the last one padding
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(4)) * 2
    logits[0, -1] = 50.0                                                    # the padding row would win everything
    full = scatter_vocab(logits, ids, model_vocab, vocab)
    ctx = ProposalContext(0, [1, 2], SamplingParams(**params), torch.Generator().manual_seed(5))
    q_rows: list = []
    counts = torch.zeros(vocab)
    for _ in range(20_000):
        counts[head_draft_token(logits, ids, model_vocab, vocab, ctx, q_rows)] += 1
    want = probs_from_logits(full, params["temperature"], params.get("top_k", -1), params.get("top_p", 1.0),
                             params.get("min_p", 0.0))[0]
    assert torch.allclose(q_rows[0], want, atol=1e-6) and all(torch.equal(q, q_rows[0]) for q in q_rows[:50])
    assert 0.5 * (counts / counts.sum() - want).abs().sum() < 0.02
    greedy = ProposalContext(0, [1, 2], SamplingParams(temperature=0.0), None)
    assert head_draft_token(logits, ids, model_vocab, vocab, greedy, []) == draft_token(full, greedy, [])
