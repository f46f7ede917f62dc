"""On a CUDA device (skipped where there is none; `pytest -m cuda` runs just these): tiny random models on the GPU,
every built-in method beside plain decoding, alone and batched together, in float32 and bfloat16; sampled
speculation keeps the target's distribution; the prefix cache's next turn equals a fresh run. CI has no GPU:
docs/benchmarks/cuda/ holds the last run on one and the command that made it."""
from __future__ import annotations

import collections

import pytest
import torch

from specdec.config import SpeculativeConfig
from specdec.engine import EngineConfig, LLMEngine
from specdec.models.loader import load_model
from specdec.models.runner import forward_once
from specdec.sampling_params import SamplingParams

DEVICE = "cuda"
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = ["def add(a, b):\n    return a + b\n\nclass Cache:", "class Cache:\n    def rollback(self, n):",
           "def f(x):\n    return f(x) + f(x)"]
METHODS = ("ngram", "suffix", "draft", "eagle3", "medusa")
# bf16 on CUDA: cuBLAS picks kernels by row count, so a verification row may differ from a decode step in the last
# bit; a divergence is allowed only where the target's top-2 logits are that close (a near-tie, not a bug).
NEAR_TIE = {torch.float32: 0.0, torch.bfloat16: 0.25}


def _heads(model, dtype):
    """test_heads' random EAGLE-3 head and Medusa heads for this target, on the device."""
    from test_heads import _eagle3, _medusa

    return {"eagle3": _eagle3(model).to(DEVICE, dtype).eval(), "medusa": _medusa(model).to(DEVICE, dtype).eval()}


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def gpu_pair(request, tiny_dirs):
    dtype = request.param
    name = str(dtype).removeprefix("torch.")
    target = load_model(str(tiny_dirs["target"]), dtype=name, device=DEVICE, progress=False)
    draft = load_model(str(tiny_dirs["draft"]), dtype=name, device=DEVICE, progress=False)
    assert next(target.model.parameters()).device.type == DEVICE
    return target, draft, _heads(target.model, dtype), dtype


def _drain(engine, seqs):
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
    return seqs


def _agrees(model, dtype, prompt, base, other):
    """other == base, or they part where the target's top-2 logits are within the dtype's near-tie margin."""
    i = next((j for j, (a, b) in enumerate(zip(base, other)) if a != b), None)
    if i is None:
        return len(base) == len(other)
    top2 = forward_once(model, prompt + base[:i])[-1].float().topk(2).values
    return float(top2[0] - top2[1]) <= NEAR_TIE[dtype]


def test_every_method_alone_and_batched_gives_plain_greedy_output(gpu_pair):
    target, draft, heads, dtype = gpu_pair
    tok = target.tokenizer
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [tok.encode(p) for p in PROMPTS]
    plain_engine = LLMEngine(EngineConfig(target.model, tok))
    plain = [_drain(plain_engine, [plain_engine.add_request(f"p{i}", p, params)])[0].output_ids
             for i, p in enumerate(prompts)]
    engine = LLMEngine(EngineConfig(target.model, tok, draft.model, heads=heads))
    for method in METHODS:                              # alone
        # draft_p_min 0: chains of k (the tiny draft is never 0.75 sure of a token)
        seq = _drain(engine, [engine.add_request(method, prompts[0], params,
                                                 SpeculativeConfig(method, 3, draft_p_min=0.0))])[0]
        assert _agrees(target.model, dtype, prompts[0], plain[0], seq.output_ids), method
        assert seq.stats.draft_tokens > 0, method
    seqs = _drain(engine, [engine.add_request(f"{m}{i}", p, params,                      # all together
                                              SpeculativeConfig(m, 3, draft_p_min=0.0))
                           for m in METHODS for i, p in enumerate(prompts)])
    for s in seqs:
        i = int(s.request_id[-1])
        assert _agrees(target.model, dtype, prompts[i], plain[i], s.output_ids), s.request_id


def test_sampled_draft_speculation_keeps_the_targets_distribution(gpu_pair):
    """The second sampled token over many seeds (the first one the draft proposes and the rejection sampler
    decides), with and without speculation (draft, k=3), against its exact marginal under the target
    (sum over first tokens t of p(t) p(. | t)): both within a chi-square bound of it."""
    target, draft, _, dtype = gpu_pair
    tok = target.tokenizer
    ids = tok.encode(PROMPTS[1])
    p1 = torch.softmax(forward_once(target.model, ids)[-1].float(), -1).cpu()
    p2 = torch.zeros_like(p1)
    for t in torch.nonzero(p1 > 1e-4).flatten().tolist():
        p2 += p1[t] * torch.softmax(forward_once(target.model, ids + [t])[-1].float(), -1).cpu()
    engine = LLMEngine(EngineConfig(target.model, tok, draft.model))
    n = 400
    for method in ("none", "draft"):
        spec = SpeculativeConfig(method, 3, draft_p_min=0.0) if method != "none" else None
        seqs = _drain(engine, [engine.add_request(f"{method}{s}", ids, SamplingParams(
            max_tokens=4, temperature=1.0, seed=s, ignore_eos=True), spec) for s in range(n)])
        c = collections.Counter(s.output_ids[1] for s in seqs)
        if method == "draft":
            assert sum(s.stats.draft_tokens for s in seqs) > 0
        top = p2.topk(8).indices.tolist()                    # the likely tokens, the rest pooled
        observed = [c.get(t, 0) for t in top] + [n - sum(c.get(t, 0) for t in top)]
        expected = [n * float(p2[t]) for t in top] + [n * (1 - float(p2[top].sum()))]
        chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 1)
        assert chi2 < 27.9, (method, chi2, observed, expected)      # chi-square, 8 dof, p = 0.0005


def test_prefix_cache_next_turn_equals_a_fresh_run(gpu_pair):
    target, draft, _, dtype = gpu_pair
    tok = target.tokenizer
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    first = tok.encode(PROMPTS[0])
    cached = LLMEngine(EngineConfig(target.model, tok, draft.model, enable_prefix_caching=True))
    answer = _drain(cached, [cached.add_request("t1", first, params,
                                                SpeculativeConfig("draft", 3, draft_p_min=0.0))])[0].output_ids
    while cached.settle():            # as an idle server does on CUDA, where prompt rows are not exact
        pass
    second = first + answer + tok.encode("\nclass Store:")
    seq = _drain(cached, [cached.add_request("t2", second, params, SpeculativeConfig("draft", 3, draft_p_min=0.0))])[0]
    fresh = LLMEngine(EngineConfig(target.model, tok, draft.model))
    base = _drain(fresh, [fresh.add_request("f", second, params, SpeculativeConfig("draft", 3, draft_p_min=0.0))])[0]
    assert seq.stats.cached_tokens > len(first) // 2
    assert _agrees(target.model, dtype, second, base.output_ids, seq.output_ids)
