"""Drafts from another vocabulary (method cross_vocab): a tiny Qwen2 target with a byte-level BPE, drafted for by a
tiny Gemma 3 with a SentencePiece-style vocabulary (spaces as U+2581, byte fallback) trained on the same text."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import CORPUS
from second_token import exact_marginal, second_token_proposals, second_tokens

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.errors import SpecDecError

BYTES = [f"<0x{b:02X}>" for b in range(256)]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def make_sp_tokenizer(directory, corpus: str, vocab_size: int) -> int:
    """A Gemma-shaped tokenizer (BPE over U+2581-spelled text, byte fallback) in HF format."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=GEMMA_SPECIALS + BYTES, show_progress=False)
    tok.train_from_iterator([corpus], trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<eos>", "bos_token": "<bos>", "add_bos_token": True}))
    return tok.get_vocab_size()


def make_tiny_sp_gemma(directory, corpus: str = CORPUS, vocab_size: int = 600, seed: int = 3):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    directory.mkdir(parents=True, exist_ok=True)
    vocab = make_sp_tokenizer(directory, corpus, vocab_size)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, sliding_window=16, query_pre_attn_scalar=16, max_position_embeddings=512,
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.25 if p.dim() == 2 else 0.3)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.fixture(scope="module")
def sp_draft(tmp_path_factory):
    return make_tiny_sp_gemma(tmp_path_factory.mktemp("xv") / "draft")


@pytest.fixture(scope="module")
def llm(tiny_dirs, sp_draft, tmp_path_factory):
    from model_cache import private_cache

    with private_cache(tmp_path_factory):
        return LLM(target=str(tiny_dirs["target"]), draft=str(sp_draft), dtype="float32", progress=False,
                   speculative=SpeculativeConfig(method="cross_vocab", num_speculative_tokens=4))


def test_the_map_pairs_tokens_by_their_bytes_never_by_their_spelling(llm):
    xv = llm.engine.proposers["cross_vocab"]
    target, draft = llm.tokenizer, llm.draft.tokenizer
    assert "draft" not in llm.engine.proposers                     # the same-vocabulary draft is not built
    pairs = list(zip(xv.map.draft_ids.tolist(), xv.map.target_ids.tolist()))
    assert len(pairs) > 50 and xv.map.shared_words > 16        # the target's small vocabulary has ~60 merges
    assert all(draft.token_bytes(d) == target.token_bytes(t) for d, t in pairs)
    spaced = [(d, t) for d, t in pairs if draft.id_to_token(d).startswith("\u2581") and len(draft.token_bytes(d)) > 1]
    assert spaced and all(target.id_to_token(t).startswith("\u0120") for _, t in spaced)    # ▁the <-> Ġthe
    assert not set(xv.map.target_ids.tolist()) & set(target.control_token_ids())
    assert not set(xv.map.draft_ids.tolist()) & set(draft.control_token_ids())
    assert len(set(xv.map.target_ids.tolist())) == len(pairs) == len(set(xv.map.draft_ids.tolist()))


def test_greedy_tokens_are_the_targets_and_drafts_are_target_ids(llm):
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = ["def add(a, b):\n    return a + b\n", "你好，世界！ The quick brown fox", "class Cache:"]
    plain = [o.token_ids for o in llm.generate(prompts, params, spec="none")]
    outs = llm.generate(prompts, params, spec="cross_vocab")                  # batched, per-row acceptance
    for want, out in zip(plain, outs):
        assert out.token_ids == want
    assert sum(o.stats.draft_tokens for o in outs) > 20
    shared = set(llm.engine.proposers["cross_vocab"].map.target_ids.tolist())
    seen = []
    real = llm.engine.proposers["cross_vocab"].propose

    def spy(ctxs, ks):
        drafts = real(ctxs, ks)
        seen.extend(t for d in drafts for t in d.token_ids.tolist())
        return drafts
    llm.engine.proposers["cross_vocab"].propose = spy
    try:
        assert llm.generate(prompts[0], params, spec="cross_vocab")[0].token_ids == plain[0]
    finally:
        del llm.engine.proposers["cross_vocab"].propose
    assert seen and set(seen) <= shared                                # never a draft id the target lacks


def test_a_sampled_draft_comes_from_the_q_it_reports(llm):
    """q_draft is the draft's processed distribution renormalised over the shared tokens and scattered into the
    target's vocabulary (zero elsewhere), and the proposed token is a draw from it: what exact verification needs
    (the verifier's own exactness is tests/test_sampler.py's)."""
    from specdec.proposers.base import ProposalContext

    xv = llm.engine.proposers["cross_vocab"]
    ids = llm.tokenizer.encode("def add(a, b):\n    return a")
    params = SamplingParams(temperature=0.8, top_k=12)
    counts = torch.zeros(llm.tokenizer.vocab_size)
    q0 = None
    for i in range(3000):
        ctx = ProposalContext(seq_id=10_000 + i, token_ids=ids, params=params,
                              generator=torch.Generator().manual_seed(i))
        d = xv.propose([ctx], [1])[0]
        xv.release(ctx.seq_id)
        q = d.q_draft[0]
        q0 = q if q0 is None else q0
        assert torch.allclose(q, q0) and abs(q.sum().item() - 1) < 1e-5
        counts[int(d.token_ids[0])] += 1
    outside = torch.ones_like(q0, dtype=torch.bool)
    outside[xv.map.target_ids] = False
    assert q0[outside].abs().max() == 0 and (q0 > 0).sum() == 12
    tv = 0.5 * (counts / counts.sum() - q0).abs().sum().item()
    assert tv < 0.05, tv


def test_sampled_outputs_stay_in_the_targets_support_with_a_seed_reproducible(llm):
    params = SamplingParams(max_tokens=24, temperature=0.9, top_k=20, seed=5, ignore_eos=True)
    a = llm.generate("def add(a, b):", params, spec="cross_vocab")[0]
    b = llm.generate("def add(a, b):", params, spec="cross_vocab")[0]
    assert a.token_ids == b.token_ids and a.stats.draft_tokens > 0


def test_a_pair_that_shares_no_words_is_refused_in_one_line(tiny_dirs, tmp_path):
    other = make_tiny_sp_gemma(tmp_path / "other", corpus="жзийклмнопрстуфхцчшщ " * 200 + "αβγδεζηθ " * 200,
                               vocab_size=330)
    with pytest.raises(SpecDecError) as err:
        LLM(target=str(tiny_dirs["target"]), draft=str(other), dtype="float32", progress=False,
            speculative=SpeculativeConfig(method="cross_vocab", num_speculative_tokens=4))
    assert "multi-byte tokens" in str(err.value) and len(str(err.value).splitlines()) == 1
    with pytest.raises(SpecDecError, match="cross_vocab"):        # the same-vocabulary method names the other one
        LLM(target=str(tiny_dirs["target"]), draft=str(other), dtype="float32", progress=False,
            speculative=SpeculativeConfig(method="draft", num_speculative_tokens=4))



def test_sampled_outputs_follow_the_targets_distribution(llm):
    """The second token of 2,000 seeded requests (the first one speculated: drafted by cross_vocab, verified) against
    its exact marginal under the target (sum over the first token of p(t0) p(t1 | t0), top-k 5 so it is a small
    table). The control: the draft's own proposals for that token, far from the target's marginal, with some of them
    accepted -- the verifier, not the proposals, makes the outputs right."""
    params = SamplingParams(max_tokens=4, temperature=1.0, top_k=5, ignore_eos=True)    # room to draft after t0
    ids = llm.tokenizer.encode("def add(a, b):\n    return")
    vocab = llm.tokenizer.vocab_size                                           # padding rows are never sampled
    want = exact_marginal(llm.engine.model, ids, vocab)
    n = 2000
    with second_token_proposals(llm.engine.proposers["cross_vocab"], len(ids), vocab) as proposed:
        got = second_tokens(llm, ids, params, n, SpeculativeConfig(method="cross_vocab", num_speculative_tokens=2))
    tv = 0.5 * (got / n - want).abs().sum().item()
    assert tv < 0.06, tv
    assert proposed.sum() > 0.9 * n                                            # it drafted (nearly) every time
    tv_proposed = 0.5 * (proposed / proposed.sum() - want).abs().sum().item()
    kept = sum(min(g, q) for g, q in zip((got / n).tolist(), (proposed / proposed.sum()).tolist()))
    assert tv_proposed > 3 * tv and kept > 0.01, (tv_proposed, kept)     # a few per cent of proposals survive


@pytest.mark.real_models
def test_real_target_with_the_gemma_draft_keeps_greedy_tokens():
    """The default target (int4) drafted for by Gemma 3 270M: two prompts batched, the plain tokens kept, drafts
    accepted; the pair shares most of Qwen's vocabulary by bytes."""
    llm = LLM(draft="gemma3-270m", quantization="int4", progress=False,
              speculative=SpeculativeConfig(method="cross_vocab", num_speculative_tokens=4))
    assert llm.engine.proposers["cross_vocab"].status()["shared_tokens"] > 50_000
    prompts = ["Write a Python function that returns the n-th Fibonacci number iteratively.",
               "Rewrite this function with type hints and a docstring:\n\ndef mean(xs):\n    total = 0\n"
               "    for x in xs:\n        total += x\n    return total / len(xs)"]
    params = SamplingParams(max_tokens=20, temperature=0.0)
    plain = llm.generate(prompts, params, spec="none")
    outs = llm.generate(prompts, params, spec="cross_vocab")
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert sum(o.stats.accepted_tokens for o in outs) > 0


def test_roles_swapped_an_untied_byte_level_draft_for_a_sentencepiece_target(tiny_dirs, sp_draft, tmp_path_factory):
    """The SentencePiece-style model as the target and the byte-level tiny Qwen (its own untied, packed output
    head: every row computed, the shared ones kept) as the draft: the plain greedy tokens, drafts made."""
    from model_cache import private_cache

    with private_cache(tmp_path_factory):
        llm = LLM(target=str(sp_draft), draft=str(tiny_dirs["target"]), dtype="float32", progress=False,
                  speculative=SpeculativeConfig(method="cross_vocab", num_speculative_tokens=3))
    assert llm.engine.proposers["cross_vocab"].head is None            # no float rows to cut from a packed head
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    prompt = "def add(a, b):\n    return a + b\n"
    plain = llm.generate(prompt, params, chat=False, spec="none")[0]
    out = llm.generate(prompt, params, chat=False, spec="cross_vocab")[0]
    assert out.token_ids == plain.token_ids and out.stats.draft_tokens > 0
