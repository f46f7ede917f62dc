"""Penalties, logit_bias and min_tokens: each verification row adjusted from its own prefix (the draft tokens before
it included) keeps speculative decoding exact -- greedy tokens equal plain decoding's under every method, and sampled
tokens follow the penalised target's distribution."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.sampling.logits import probs_from_logits
from specdec.sampling.penalties import Penalties
from specdec.sampling.verifier import Verification, verify_step

PARAMS = dict(presence_penalty=0.6, frequency_penalty=0.9, repetition_penalty=1.7, logit_bias={2: 1.5, 4: -100.0},
              min_tokens=2)
STOP = frozenset({5})


def reference_logits(raw: list[float], prompt: list[int], output: list[int], p: SamplingParams) -> list[float]:
    """The adjusted row, written out token by token (vLLM's order: bias and min_tokens, then repetition, frequency
    and presence penalties)."""
    counts = Counter(output)
    out = []
    for t, x in enumerate(raw):
        x += (p.logit_bias or {}).get(t, 0.0)
        if len(output) < p.min_tokens and t in STOP:
            x = -math.inf
        if p.repetition_penalty != 1.0 and (t in prompt or counts[t]):
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        x -= p.frequency_penalty * counts[t] + p.presence_penalty * (counts[t] > 0)
        out.append(x)
    return out


def test_each_row_is_adjusted_from_its_own_prefix():
    g = torch.Generator().manual_seed(0)
    V = 12
    params = SamplingParams(max_tokens=8, **PARAMS)
    prompt, output, draft = [0, 1, 7], [3, 3], [3, 9, 7]
    logits = torch.randn(len(draft) + 1, V, generator=g) * 3
    got = Penalties(params, prompt, output, STOP).apply(logits, draft)
    for j in range(len(draft) + 1):
        want = torch.tensor(reference_logits(logits[j].tolist(), prompt, output + draft[:j], params))
        assert torch.allclose(got[j], want, atol=1e-5), j
    # one draft step: the row after all of `drafted`; a longer output lifts min_tokens' mask
    one = Penalties(params, prompt, output, STOP).apply(logits[:1], draft[:2])
    assert torch.allclose(one[0], torch.tensor(reference_logits(logits[0].tolist(), prompt, output + draft[:2],
                                                                params)), atol=1e-5)
    assert torch.isfinite(got[:, 5]).all()                              # two tokens out already: min_tokens met
    short = Penalties(params, prompt, [], STOP).apply(logits, draft)
    assert torch.isinf(short[:2, 5]).all() and torch.isfinite(short[2:, 5]).all()


# -- sampled: the emitted tokens follow the penalised target (enumerated exactly over a small vocabulary) -----------
V, N, POSITIONS, K = 6, 8_000, 3, 2
PROMPT = [0, 1]


def _tables(seed):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(V, V, generator=g) * 1.2          # row: previous token
    draft = target + torch.randn(V, V, generator=g)
    return target, draft


def _exact_marginals(target, params):
    """P(token at position i) under the penalised target, by enumerating every output of POSITIONS tokens."""
    marg = torch.zeros(POSITIONS, V, dtype=torch.float64)
    for seq in itertools.product(range(V), repeat=POSITIONS):
        p, prev, out = 1.0, PROMPT[-1], []
        for x in seq:
            row = torch.tensor(reference_logits(target[prev].tolist(), PROMPT, out, params))
            p *= probs_from_logits(row[None], params.temperature)[0, x].item()
            out.append(x)
            prev = x
        for i, x in enumerate(seq):
            marg[i, x] += p
    return marg


def _simulate(target, draft, params, stale=False, seed=0):
    """N sequences decoded speculatively as the engine verifies: K tokens drafted from the (unpenalised) draft, the
    target's rows adjusted by each sequence's Penalties (stale: every row from the committed output alone, the
    negative control)."""
    g = torch.Generator().manual_seed(seed)
    outs = [[] for _ in range(N)]
    q_all = probs_from_logits(draft, params.temperature)
    while True:
        live = [i for i in range(N) if len(outs[i]) < POSITIONS]
        if not live:
            break
        items = []
        for i in live:
            prev, toks, qs, rows = (outs[i] or PROMPT)[-1], [], [], []
            rows.append(target[prev])
            for _ in range(K):
                q = q_all[prev]
                x = int(torch.multinomial(q, 1, generator=g))
                toks.append(x)
                qs.append(q)
                rows.append(target[x])
                prev = x
            pen = Penalties(params, PROMPT, outs[i], STOP)
            logits = torch.stack(rows)
            if stale:
                logits = torch.cat([pen.apply(r[None], []) for r in logits])
            items.append(Verification(logits, torch.tensor(toks), torch.stack(qs), None, params, g,
                                      penalties=None if stale else pen))
        for i, (_, emitted, _) in zip(live, verify_step(items, V)):
            outs[i].extend(emitted[: POSITIONS - len(outs[i])])
    seqs = torch.tensor(outs)
    return torch.stack([torch.bincount(seqs[:, i], minlength=V).double() / N for i in range(POSITIONS)])


def _tv(a, b):
    return (0.5 * (a - b).abs().sum(-1)).max().item()


def test_sampled_tokens_follow_the_penalised_target():
    target, draft = _tables(3)
    params = SamplingParams(max_tokens=8, temperature=1.0, **PARAMS)
    exact = _exact_marginals(target, params)
    got = _simulate(target, draft, params)
    assert _tv(got, exact) < 0.02
    assert got[:, 4].sum() == 0                                        # a bias of -100 keeps token 4 out
    assert exact[:2, 5].sum() == 0                                     # min_tokens: no stop token in the first 2
    # the control: rows adjusted only from the committed output (not the draft tokens before them) drift
    assert _tv(_simulate(target, draft, params, stale=True), exact) > 0.05


# -- the tiny pair: greedy tokens with penalties are plain decoding's under every method ------------------------------
@pytest.fixture(scope="module")
def self_draft(tiny_dirs):
    return LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["target"]), dtype="float32", device="cpu",
               # draft_p_min 0: chains of k (the tiny draft is never 0.75 sure of a token)
               speculative=SpeculativeConfig(method="draft", num_speculative_tokens=3, draft_p_min=0.0), progress=False)


def test_greedy_with_penalties_is_plain_decoding_under_every_method(self_draft):
    llm = self_draft
    tok = llm.tokenizer
    bias_id = tok.encode("def")[0]
    kinds = [dict(frequency_penalty=0.8), dict(presence_penalty=1.2), dict(repetition_penalty=1.5),
             dict(logit_bias={bias_id: 5.0}), dict(min_tokens=30, ignore_eos=False),
             dict(frequency_penalty=0.4, presence_penalty=0.3, repetition_penalty=1.2, logit_bias={bias_id: -100.0})]
    methods = [m for m in llm.engine.proposers if m not in ("predicted_outputs",)] + ["auto"]
    assert {"draft", "ngram", "suffix"} <= set(methods)
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    for kw in kinds:
        params = SamplingParams(max_tokens=40, temperature=0.0, **kw)
        plain = llm.generate(prompt, params, spec="none")[0].token_ids
        free = llm.generate(prompt, SamplingParams(max_tokens=40, temperature=0.0), spec="none")[0].token_ids
        if "min_tokens" not in kw:
            assert plain != free, kw                                   # the adjustment changes the answer here
        for method in methods:
            spec = method if method == "auto" else SpeculativeConfig(method=method, num_speculative_tokens=3,
                                                                     draft_p_min=0.0)
            got = llm.generate(prompt, params, spec=spec)[0]
            assert got.token_ids == plain, (kw, method)
        if "logit_bias" in kw and kw["logit_bias"][bias_id] < 0:
            assert bias_id not in plain


def test_min_tokens_holds_off_eos_and_stop_strings(self_draft):
    llm = self_draft
    eos = llm.tokenizer.eos_token_ids[0]
    first = llm.generate("x", SamplingParams(max_tokens=20, temperature=0.0, logit_bias={eos: 100.0}),
                         spec="none")[0]
    assert first.token_ids == [eos] and first.finish_reason == "stop"       # EOS forced at once
    held = llm.generate("x", SamplingParams(max_tokens=20, temperature=0.0, logit_bias={eos: 100.0}, min_tokens=5),
                        spec="none")[0]
    assert len(held.token_ids) == 6 and held.token_ids[-1] == eos and eos not in held.token_ids[:5]


@pytest.mark.parametrize("kw, message", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-3.0), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(logit_bias={3: 101.0}), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"), (dict(min_tokens=20), "min_tokens")])
def test_bad_values_are_refused_naming_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(max_tokens=10, **kw)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammar_that_ends_before_min_tokens_wins(self_draft, temperature):
    """min_tokens masks EOS, a one-digit grammar then allows nothing else: the grammar ends the output (no NaN)."""
    from specdec.sampling.grammar import StructuredOutputs

    params = SamplingParams(max_tokens=10, temperature=temperature, seed=0, min_tokens=5,
                            structured_outputs=StructuredOutputs(json={"type": "integer", "minimum": 0, "maximum": 9}))
    for spec in ("none", SpeculativeConfig(method="draft", num_speculative_tokens=3, draft_p_min=0.0)):
        out = self_draft.generate("x", params, spec=spec)[0]
        assert out.finish_reason == "stop" and out.text.strip().isdigit(), (spec, out.text)
