"""Exactness of the rejection sampler: the emitted tokens follow the target.

Every check runs `verify_ragged`, what the engine verifies with: the target's logits go in with the sampling
parameters and are processed inside it, as in a step. A vectorised generator runs 60k independent sequences: draft
k tokens from q (which depends on the previous token), verify against the target (also prefix-dependent), append,
repeat until every sequence has 3 tokens; then compare the empirical marginals at positions 1-3 with the target's
exact marginals.
"""
import pytest
import torch

from specdec.sampling.logits import probs_from_logits
from specdec.sampling.rejection import verify_ragged
from specdec.sampling_params import SamplingParams

V, N, POSITIONS, TV_BOUND = 24, 60_000, 3, 0.015
PAD = -1          # a sequence's slots not filled yet


def _tables(seed, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0):
    """(target logits [V, V], target probs P, draft probs Q, sampling params); row = previous token. P and Q are
    processed by the same parameters (as the engine's draft is); verify_ragged processes the logits itself."""
    g = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(V, V, generator=g) * 1.5
    draft_logits = target_logits + torch.randn(V, V, generator=g) * 1.0   # a related but different draft
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    return (target_logits, probs_from_logits(target_logits, **kw), probs_from_logits(draft_logits, **kw),
            SamplingParams(**kw))


def _ragged(logits, q_draft, draft_tokens, generator, params):
    """verify_ragged over B sequences of one draft length, as tensors: logits [B, k+1, V], q_draft [B, k, V] or None
    (one-hot), draft_tokens [B, k] -> num_accepted [B], emitted [B, k+1] (PAD after a row's last token). The
    sequences share one generator (each draws its uniforms from it in turn)."""
    B, k = draft_tokens.shape
    results = verify_ragged(list(logits), list(draft_tokens), [None] * B if q_draft is None else list(q_draft),
                            [params] * B, [generator] * B)
    n = torch.tensor([r[0] for r in results])
    emitted = torch.full((B, k + 1), PAD)
    emitted[torch.arange(k + 1) <= n[:, None]] = torch.tensor([t for _, toks in results for t in toks])
    return n, emitted


def _run(L, Q, k, seed, params, sampler=_ragged, use_q=True, q_row=None, q_told=None, num_seqs=N, l_row=None):
    """L: the target's logits (row = previous token); Q: the draft's probabilities. q_row(prev0, prev, j): the draft's
    distribution for draft position j (default Q[prev]; a Medusa head's depends on prev0, the token before the
    draft, and j only). q_told: the distribution handed to verification instead of the one drawn from (negative
    controls). l_row(prev0, x): the target's logits for the row after draft token x (default L[x])."""
    g = torch.Generator().manual_seed(seed)
    seqs = torch.full((num_seqs, POSITIONS), PAD, dtype=torch.long)
    filled = torch.zeros(num_seqs, dtype=torch.long)
    last = torch.zeros(num_seqs, dtype=torch.long)  # context token 0
    while (filled < POSITIONS).any():
        active = (filled < POSITIONS).nonzero().squeeze(-1)
        prev0 = prev = last[active]
        drafts, q_rows, logit_rows = [], [], [L[prev]]
        for j in range(k):
            q = Q[prev] if q_row is None else q_row(prev0, prev, j)
            x = torch.multinomial(q, 1, generator=g).squeeze(-1)
            drafts.append(x)
            q_rows.append(q if q_told is None else q_told(prev0, prev, j))
            logit_rows.append(L[x] if l_row is None else l_row(prev0, x))
            prev = x
        n, emitted = sampler(torch.stack(logit_rows, 1), torch.stack(q_rows, 1) if use_q else None,
                             torch.stack(drafts, 1), g, params)
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
    L, P, Q, params = _tables(seed=k)
    assert all(tv < TV_BOUND for tv in _tv(_run(L, Q, k, 100 + k, params), P))


@pytest.mark.parametrize("processing", [dict(temperature=0.7), dict(temperature=1.3, top_k=6),
                                        dict(top_p=0.8), dict(min_p=0.1),
                                        dict(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05)])
def test_exact_under_logits_processing(processing):
    L, P, Q, params = _tables(seed=7, **processing)
    seqs = _run(L, Q, 3, 11, params)
    assert all(tv < TV_BOUND for tv in _tv(seqs, P))
    # every emitted token lies inside the target's mask
    for i, m in enumerate(_marginals(P)):
        assert (m[seqs[:, i]] > 0).all()


def _run_stopped(L, Q, k, seed, params, length):
    """_run with chains of their own lengths: k tokens drawn from Q, then length(prev, drafts) -> [B] how many of
    them each sequence's chain keeps (its stopping rule), verified by verify_ragged as the engine verifies them."""
    g = torch.Generator().manual_seed(seed)
    seqs = torch.full((N, POSITIONS), PAD, dtype=torch.long)
    filled = torch.zeros(N, dtype=torch.long)
    last = torch.zeros(N, dtype=torch.long)
    while (filled < POSITIONS).any():
        active = (filled < POSITIONS).nonzero().squeeze(-1)
        prev = last[active]
        drafts = []
        for _ in range(k):
            drafts.append(torch.multinomial(Q[prev if not drafts else drafts[-1]], 1, generator=g).squeeze(-1))
        x = torch.stack(drafts, 1)                                           # [B, k]
        before = torch.cat([prev[:, None], x[:, :-1]], 1)                    # each draft token's previous token
        n = length(before, x)
        results = verify_ragged([L[torch.cat([prev[i:i + 1], x[i, :n[i]]])] for i in range(len(active))],
                                [x[i, :n[i]] for i in range(len(active))],
                                [Q[before[i, :n[i]]] for i in range(len(active))],
                                [params] * len(active), [g] * len(active))
        for i, (_, toks) in enumerate(results):
            row = int(active[i])
            for t in toks:
                if filled[row] < POSITIONS:
                    seqs[row, filled[row]] = t
                    filled[row] += 1
            last[row] = toks[-1]
    return seqs


def test_a_chain_that_stops_after_an_unsure_token_stays_exact():
    """The draft model's draft_p_min: a chain ends after a token whose q_draft gave its likeliest token less than
    p_min (here the median row's, so chains of every length occur). The rule reads the draft alone, so the emitted
    tokens still follow the target; a rule that reads the target (dropping the tokens it gives less than the draft
    does) biases them, and the same bound catches it."""
    L, P, Q, params = _tables(seed=12)
    k = 3
    p_min = Q.max(-1).values.median()

    def unsure_stops(before, x):
        unsure = Q[before].max(-1).values < p_min                            # [B, k]: stop after this token
        first = torch.where(unsure.any(1), unsure.int().argmax(1) + 1, torch.full((len(x),), k))
        return first

    seqs = _run_stopped(L, Q, k, 21, params, unsure_stops)
    assert all(tv < TV_BOUND for tv in _tv(seqs, P))

    def peeks_at_target(before, x):
        worse = P[before, x] < Q[before, x]                                  # the target would rather not: drop it
        return torch.where(worse.any(1), worse.int().argmax(1), torch.full((len(x),), k))

    assert max(_tv(_run_stopped(L, Q, k, 21, params, peeks_at_target), P)) > TV_BOUND


def test_ngram_one_hot_draft_is_exact():
    # a deterministic proposer: q is one-hot on the proposed token (here drawn from Q, passed as None)
    L, P, Q, params = _tables(seed=3)
    assert all(tv < TV_BOUND for tv in _tv(_run(L, Q, 3, 5, params, use_q=False), P))


def test_negative_control_always_accept_fails():
    def always_accept(logits, q_draft, draft_tokens, generator, params):
        B, k = draft_tokens.shape
        bonus = torch.multinomial(torch.softmax(logits[:, k], -1), 1, generator=generator)
        return torch.full((B,), k), torch.cat([draft_tokens, bonus], 1)

    L, P, Q, params = _tables(seed=3)
    assert max(_tv(_run(L, Q, 3, 5, params, sampler=always_accept), P)) > TV_BOUND


def test_negative_control_draft_not_from_q_fails():
    # verifying with the wrong q (claims tokens came from P when they came from Q) biases the output
    L, P, Q, params = _tables(seed=4)
    assert max(_tv(_run(L, Q, 3, 6, params, q_told=lambda prev0, prev, j: P[prev]), P)) > TV_BOUND


def test_draft_equal_to_target_accepts_everything():
    L, P, _, params = _tables(seed=9)
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(P[:4], 1, generator=g).squeeze(-1)     # [4] drafts
    rows = L[:5]                                                 # [5, V] logits at the 4 drafts and the bonus
    q = probs_from_logits(rows, 1.0)[:4]                         # the target's own probabilities, bit for bit
    for _ in range(200):
        ((n, emitted),) = verify_ragged([rows], [x], [q], [params], [g])
        assert n == 4 and emitted[:4] == x.tolist() and len(emitted) == 5


def test_disjoint_supports_reject_and_recover_from_target():
    logits = torch.full((2, V), float("-inf"))
    logits[:, :4] = 0.0                          # target lives on 0..3
    q = torch.zeros(1, V)
    q[0, 10] = 1.0                               # draft lives on 10
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        ((n, emitted),) = verify_ragged([logits], [torch.tensor([10])], [q], [SamplingParams(temperature=1.0)], [g])
        assert n == 0 and len(emitted) == 1 and 0 <= emitted[0] < 4


def test_greedy_accepts_matching_prefix_then_recovers_or_adds_bonus():
    """Forced-argmax logits: accept while the draft equals the target's argmax, then its argmax (recovered at the
    first mismatch, bonus after the last draft); greedy rows beside sampled ones in one call."""
    def forced(argmax):                                          # [len(argmax), V] logits with these argmaxes
        return torch.nn.functional.one_hot(torch.tensor(argmax), V).float() * 10 + torch.randn(len(argmax), V)

    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
    logits = [forced([4, 7, 9, 2]), forced([4, 7, 9, 2]), forced([5]), forced([3, 3]), forced([1, 8])]
    drafts = [torch.tensor(d, dtype=torch.long) for d in ([4, 7, 1], [4, 7, 9], [], [6], [1])]
    out = verify_ragged(logits, drafts, [None] * 5, [greedy, greedy, greedy, sampled, greedy],
                        [None, None, None, torch.Generator().manual_seed(0), None])
    assert out[0] == (2, [4, 7, 9])          # recovered token 9
    assert out[1] == (3, [4, 7, 9, 2])       # bonus token 2
    assert out[2] == (0, [5])                # no draft: one plain step
    assert out[4] == (1, [1, 8])
    assert out[3][0] in (0, 1) and len(out[3][1]) == out[3][0] + 1


def test_seeded_verification_is_reproducible():
    L, _, Q, params = _tables(seed=1)
    assert torch.equal(_run(L, Q, 3, 42, params, num_seqs=20_000),
                       _run(L, Q, 3, 42, params, num_seqs=20_000))


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
    L, P, _, params = _tables(21)
    heads = [probs_from_logits(torch.randn(V, V, generator=torch.Generator().manual_seed(30 + j)) * 1.5, 1.0)
             for j in range(3)]
    seqs = _run(L, None, 3, 22, params, q_row=lambda prev0, prev, j: heads[j][prev0])
    assert all(tv < TV_BOUND for tv in _tv(seqs, P))


def test_eagle3_reduced_vocabulary_drafts_are_exact():
    """EAGLE-3: the draft's distribution is zero outside its draft vocabulary; the tokens it can never propose
    still come out with the target's probabilities (through recovery)."""
    L, P, Q, params = _tables(23)
    inside = torch.zeros(V, dtype=torch.bool)
    inside[: V // 2] = True
    Qr = Q * inside
    Qr = Qr / Qr.sum(-1, keepdim=True)
    seqs = _run(L, Qr, 3, 24, params)
    assert all(tv < TV_BOUND for tv in _tv(seqs, P))
    assert (seqs >= V // 2).float().mean() > 0.2          # tokens outside the draft vocabulary do come out


def test_negative_control_medusa_q_of_another_head_fails():
    """Control: Medusa-shaped drafts drawn from head j but verified against head j+1's distribution are not exact,
    so the tests above can fail. (Verifying them as one-hot guesses would be exact: a random draft independent of
    the verification coin is a mixture of fixed guesses.)"""
    L, P, _, params = _tables(21)
    heads = [probs_from_logits(torch.randn(V, V, generator=torch.Generator().manual_seed(30 + j)) * 1.5, 1.0)
             for j in range(3)]
    seqs = _run(L, None, 3, 26, params, q_row=lambda prev0, prev, j: heads[j][prev0],
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
