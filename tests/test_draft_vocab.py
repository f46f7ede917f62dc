"""The draft model's output head cut to the tokens its target emits (FR-Spec): the cut head computes the full head's
rows, greedy outputs stay plain decoding's, a sampled draft comes from the distribution over the kept rows it
reports, and the outputs follow the target's distribution, also where the target's likeliest tokens are cut."""
from __future__ import annotations

import pytest
import torch
from second_token import exact_marginal, second_token_proposals, second_tokens

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.errors import SpecDecError
from specdec.models.runner import forward_once
from specdec.proposers import draft_model, draft_vocab

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def ranking(tmp_path_factory, tiny_dirs):
    """A ranking for the tiny target that puts the target's own likeliest next tokens after PROMPT at the end, so a
    head cut to its first half cannot propose them: only the verifier's residual can emit them."""
    from model_cache import private_cache

    from specdec.models.loader import load_model

    with private_cache(tmp_path_factory):
        target = load_model(str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
    ids = target.tokenizer.encode(PROMPT)
    vocab = target.tokenizer.vocab_size
    liked = forward_once(target.model, ids)[-1, :vocab].topk(3).indices.tolist()
    ranked = [t for t in range(vocab) if t not in liked] + liked
    path = tmp_path_factory.mktemp("ranking") / "draft-vocab.safetensors"
    draft_vocab.save_ranking(path, torch.tensor(ranked), {"target": "tiny"})
    return path, liked, vocab


@pytest.fixture(scope="module")
def llm(tiny_dirs, ranking, tmp_path_factory):
    from model_cache import private_cache

    path, _, vocab = ranking
    with pytest.MonkeyPatch.context() as mp, private_cache(tmp_path_factory):
        mp.setattr(draft_vocab, "ranking_path", lambda name: path)
        return LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", progress=False,
                   speculative=SpeculativeConfig(method="draft", num_speculative_tokens=3,
                                                 draft_vocab_size=vocab // 2))


@pytest.fixture
def cut_only(monkeypatch):
    """Sequences keep to the cut and their own rows: the tiny target writes random bytes, which would soon send them
    to the whole head (WHOLE_HEAD_SHARE, tested on its own below)."""
    monkeypatch.setattr(draft_model, "WHOLE_HEAD_SHARE", float("inf"))


def test_the_cut_head_computes_the_full_heads_rows(tiny_dirs, tmp_path_factory):
    from model_cache import private_cache

    from specdec.models.loader import load_model

    keep = torch.tensor([5, 0, 17, 300, 42, 43, 1])
    with private_cache(tmp_path_factory):
        full = load_model(str(tiny_dirs["draft"]), dtype="float32", device="cpu", progress=False)
        cut = load_model(str(tiny_dirs["draft"]), dtype="float32", device="cpu", progress=False, output_ids=keep)
    ids = full.tokenizer.encode(PROMPT)
    assert torch.equal(cut.model.output_ids, keep)
    assert torch.equal(forward_once(cut.model, ids), forward_once(full.model, ids)[:, keep])
    with pytest.raises(SpecDecError, match="distinct token ids"):
        with private_cache(tmp_path_factory):
            load_model(str(tiny_dirs["draft"]), dtype="float32", device="cpu", progress=False,
                       output_ids=torch.tensor([3, 3]))


def test_greedy_outputs_are_plain_decodings_and_drafts_come_from_the_kept_rows(llm, ranking, cut_only):
    _, liked, vocab = ranking
    proposer = llm.engine.proposers["draft"]
    kept = set(proposer.output_ids.tolist())
    assert len(kept) == vocab // 2 and not kept & set(liked)
    assert proposer.status() == {"draft_vocab_size": vocab // 2, "draft_whole_head_sequences": 0}
    drafted, seen = [], set()                  # a draft proposes the cut's tokens and the sequence's own
    real = proposer.propose

    def spy(ctxs, ks):
        drafts = real(ctxs, ks)
        drafted.extend(t for d in drafts for t in d.token_ids.tolist())
        seen.update(t for c in ctxs for t in c.token_ids)
        return drafts
    proposer.propose = spy
    try:
        params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        for prompt in (PROMPT, "class Cache:\n    def rollback(self, n):"):
            plain = llm.generate(prompt, params, spec="none")[0].token_ids
            # draft_p_min 0: chains of k (the tiny draft is never 0.75 sure of a token)
            out = llm.generate(prompt, params, spec=SpeculativeConfig(method="draft", num_speculative_tokens=3,
                                                                      draft_p_min=0.0))[0]
            assert out.token_ids == plain and out.stats.draft_tokens > 0
    finally:
        del proposer.propose
    assert drafted and set(drafted) <= kept | seen


def test_sampled_outputs_follow_the_targets_distribution_outside_the_kept_rows(llm, ranking, cut_only):
    """The second token of 1,000 seeded requests (drafted from the cut head, verified) against its exact marginal
    under the target. The target's likeliest tokens were cut: the draft never proposes them, so the control (the
    draft's own proposals) is far from the target's marginal, and the outputs still follow it."""
    _, _, vocab = ranking
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=5, ignore_eos=True)
    ids = llm.tokenizer.encode(PROMPT)
    want = exact_marginal(llm.engine.model, ids, vocab)
    proposer = llm.engine.proposers["draft"]

    def q_is_over_the_drafts_tokens(ctx, draft):         # the cut's tokens and the sequence's own, nothing else
        q = draft.q_draft[0]
        outside = torch.ones(vocab, dtype=torch.bool)
        outside[proposer.output_ids] = False
        outside[ctx.token_ids] = False
        assert abs(q.sum().item() - 1) < 1e-5 and q[outside].abs().max() == 0

    n = 1000
    with second_token_proposals(proposer, len(ids), vocab, q_is_over_the_drafts_tokens) as proposed:
        got = second_tokens(llm, ids, params, n,
                            SpeculativeConfig(method="draft", num_speculative_tokens=2, draft_p_min=0.0))
    tv = 0.5 * (got / n - want).abs().sum().item()
    assert tv < 0.07, tv
    assert proposed.sum() > 0.9 * n
    tv_proposed = 0.5 * (proposed / proposed.sum() - want).abs().sum().item()
    assert tv_proposed > 3 * tv, (tv_proposed, tv)


def test_draft_vocab_size_is_checked(tiny_dirs):
    with pytest.raises(ValueError, match="draft_vocab_size"):
        SpeculativeConfig(method="draft", draft_vocab_size=-1)
    with pytest.raises(SpecDecError, match="no token ranking ships"):          # a local target has none
        LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", progress=False,
            speculative=SpeculativeConfig(method="draft", draft_vocab_size=64))


def test_a_sequences_own_tokens_outside_the_cut_are_drafted_from_the_whole_heads_rows(llm, tiny_dirs,
                                                                                        tmp_path_factory, cut_only):
    """A prompt's rare tokens (outside the cut) join the sequence's draft vocabulary: their columns are the whole
    head's logits for them, and a prompt that repeats such a token gets it proposed."""
    from model_cache import private_cache

    from specdec.models.loader import load_model
    from specdec.proposers.base import ProposalContext

    proposer = llm.engine.proposers["draft"]
    kept = set(proposer.output_ids.tolist())
    ids = llm.tokenizer.encode("class Cache:\n    def rollback(self, n):\n        self.length = n\n")
    own = sorted({t for t in ids if t not in kept})
    assert own                                          # the tiny ranking cuts some of this prompt's tokens
    rows = proposer.context_rows(-1, ids)
    assert rows.ids == set(own) and rows.token_ids.tolist() == proposer.output_ids.tolist() + own
    with private_cache(tmp_path_factory):
        full = load_model(str(tiny_dirs["draft"]), dtype="float32", device="cpu", progress=False)
    hidden = torch.randn(2, full.config.hidden_size, generator=torch.Generator().manual_seed(0))
    cut_logits = proposer.model.compute_logits(hidden)
    logits, token_ids = proposer.columns(-1, cut_logits, hidden)
    assert torch.allclose(logits, full.model.compute_logits(hidden)[:, token_ids], atol=1e-5)
    proposer.release(-1)
    assert -1 not in proposer.extra
    # greedy drafting from a prompt that repeats itself: the draft may now propose tokens only the prompt has
    params = SamplingParams(temperature=0.0)
    d = proposer.propose([ProposalContext(-2, ids * 3, params, None)], [3])[0]
    proposer.release(-2)
    assert len(d) == 3 and set(d.token_ids.tolist()) <= kept | set(own)


def test_a_sequence_writing_in_another_script_drafts_from_the_whole_head(llm, ranking, tiny_dirs, tmp_path_factory,
                                                                         monkeypatch):
    """Once WHOLE_HEAD_SHARE of a sequence's tokens (and WHOLE_HEAD_MIN) are non-ASCII ones outside the cut (a Chinese
    answer, where the ranking was counted on English and code), its columns are the whole head's logits over the
    whole vocabulary; ASCII names outside the cut, or too few foreign tokens, keep it on the cut and its own rows.
    Greedy outputs stay plain decoding's, and sampled drafts carry a q over the whole vocabulary; the cut head computes
    no rows for such a sequence."""
    from model_cache import private_cache

    from specdec.models.loader import load_model
    from specdec.proposers.base import ProposalContext

    _, _, vocab = ranking
    proposer = llm.engine.proposers["draft"]
    kept = set(proposer.output_ids.tolist())
    tok = llm.tokenizer
    foreign = [t for t in range(vocab) if t not in kept and not tok.token_bytes(t).isascii()]
    ascii_ids = tok.encode("class Cache:\n    def rollback(self, n):\n        self.length = n\n")
    assert foreign and any(t not in kept for t in ascii_ids)          # ASCII tokens outside the cut too
    before = proposer.status()["draft_whole_head_sequences"]
    rows = proposer.context_rows(-1, ascii_ids * 4)
    assert rows is not None and not rows.whole                        # only ASCII outside the cut: its own rows
    short = ascii_ids[:20] + foreign[:draft_model.WHOLE_HEAD_MIN - 1]  # over the share, under the count
    assert not proposer.context_rows(-3, short).whole
    proposer.release(-3)
    share = draft_model.WHOLE_HEAD_SHARE
    few = int(share * len(ascii_ids) * 4) // 2 or 1                   # under the share, then over it
    assert few < share * (len(ascii_ids) * 4 + few) and 3 * few + 2 >= draft_model.WHOLE_HEAD_MIN
    rows = proposer.context_rows(-1, ascii_ids * 4 + foreign[:few])
    assert not rows.whole
    more = ascii_ids * 4 + foreign[:few] + foreign[few:few + 2 * few + 2]
    rows = proposer.context_rows(-1, more)
    assert rows.whole and proposer.status()["draft_whole_head_sequences"] == before + 1
    with private_cache(tmp_path_factory):
        full = load_model(str(tiny_dirs["draft"]), dtype="float32", device="cpu", progress=False)
    hidden = torch.randn(2, full.config.hidden_size, generator=torch.Generator().manual_seed(1))
    logits, token_ids = proposer.columns(-1, None, hidden, 2)
    assert token_ids is None
    assert torch.allclose(logits, full.model.compute_logits(hidden)[:, :vocab], atol=1e-5)
    assert proposer.context_rows(-1, more + foreign[:3]) is rows      # whole from then on
    proposer.release(-1)
    # drafting: a sampled draft's q is over the whole vocabulary, and may propose tokens neither cut nor seen
    cut_rows, cut_head = [], proposer.model.compute_logits
    monkeypatch.setattr(proposer.model, "compute_logits", lambda h: cut_rows.append(len(h)) or cut_head(h))
    d = proposer.propose([ProposalContext(-2, more, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))],
                         [3])[0]
    monkeypatch.undo()
    proposer.release(-2)
    assert len(d) == 3 and cut_rows == []                             # the whole head's logits only
    assert d.q_draft.shape[-1] >= vocab and torch.allclose(d.q_draft.sum(-1), torch.ones(len(d)), atol=1e-5)
    assert (d.q_draft[:, [t for t in range(vocab) if t not in kept and t not in set(more)]] > 0).any()
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = llm.generate(more, params, spec="none")[0].token_ids
    out = llm.generate(more, params, spec=SpeculativeConfig(method="draft", num_speculative_tokens=3,
                                                            draft_p_min=0.0))[0]
    assert out.token_ids == plain and out.stats.draft_tokens > 0
    tree = llm.generate(more, params, spec=SpeculativeConfig(method="draft", num_speculative_tokens=3, eagle_topk=2))[0]
    assert tree.token_ids == plain and tree.stats.draft_tokens > 0     # a token tree's levels from the whole head
