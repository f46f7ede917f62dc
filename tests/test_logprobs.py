"""logprobs: the target's own distribution at each emitted position, whatever proposed the token.

The tiny target doubles as its own draft here, so drafts are accepted (and the logprobs of accepted, recovered
and bonus tokens all come from verification rows, not from one-token steps)."""
from __future__ import annotations

import json
import math

import httpx
import pytest
import torch
from server_utils import running_server

from specdec import LLM, SamplingParams, SpeculativeConfig

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):"


@pytest.fixture(scope="module")
def self_draft(tiny_dirs):
    # fp32 matmuls round differently for a prompt computed in one chunk and one resumed from a prefix-cache hit
    # (~1e-6); these tests compare logprobs bit for bit across methods, so every run computes its prompt whole
    return LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["target"]), dtype="float32", device="cpu",
               speculative=SpeculativeConfig(method="draft", num_speculative_tokens=3), progress=False,
               enable_prefix_caching=False)


def _run(llm, method: str, params: SamplingParams):
    # chains of 3 (draft_p_min 0): the tiny self-draft is never 0.75 sure of a token, and the stop would make every
    # step a one-token draft
    spec = "none" if method == "none" else SpeculativeConfig(method=method, num_speculative_tokens=3, draft_p_min=0.0)
    return llm.generate(PROMPT, params, spec=spec)[0]


def test_speculation_does_not_change_logprobs_fp32(self_draft):
    params = SamplingParams(max_tokens=40, temperature=0, logprobs=3, ignore_eos=True)
    plain = _run(self_draft, "none", params)
    assert len(plain.logprobs) == len(plain.token_ids) == 40
    for method in ("draft", "ngram"):
        out = _run(self_draft, method, params)
        assert out.token_ids == plain.token_ids
        if method == "draft":
            assert out.stats.accepted_tokens > 20          # verification rows, not one-token steps
        assert [(t.token_id, t.logprob, t.top) for t in out.logprobs] == \
               [(t.token_id, t.logprob, t.top) for t in plain.logprobs]


@pytest.fixture(scope="module")
def other_draft(tiny_dirs):
    from server_utils import draft_llm

    return draft_llm(tiny_dirs)


@pytest.mark.parametrize("which", ["self_draft", "other_draft"])
def test_sampled_logprobs_are_the_targets_distribution(which, request):
    """At T = 1 a speculative run's logprobs equal the target's log-softmax over the same tokens, recomputed in one
    teacher-forced forward (a different kernel path, so to float tolerance). The target as its own draft has every
    draft accepted (bonus tokens too); the tiny random draft has them rejected (recovered tokens)."""
    self_draft = request.getfixturevalue(which)
    out = _run(self_draft, "draft", SamplingParams(max_tokens=30, temperature=1.0, seed=7, logprobs=2,
                                                    ignore_eos=True))
    if which == "self_draft":
        assert out.stats.accepted_tokens == out.stats.draft_tokens > 0
    else:
        assert out.stats.draft_tokens > out.stats.accepted_tokens
    from specdec.models.runner import forward_once

    logits = forward_once(self_draft.target.model, out.prompt_token_ids + out.token_ids)      # [T, V]
    V = self_draft.tokenizer.vocab_size
    n = len(out.prompt_token_ids)
    ref = torch.log_softmax(logits[n - 1:-1, :V].float(), dim=-1)
    got = torch.tensor([t.logprob for t in out.logprobs])
    want = ref[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)]
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    for t, row in zip(out.logprobs, ref):
        top = row.topk(2)
        assert [i for i, _ in t.top] == top.indices.tolist()
        assert t.logprob <= t.top[0][1] + 1e-6


@pytest.fixture(scope="module")
def server(self_draft):
    with running_server(self_draft, SpeculativeConfig(method="draft", num_speculative_tokens=3)) as (url, state):
        yield url, state


def _chat(url, **extra):
    body = {"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 12, "temperature": 0} | extra
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def test_chat_logprobs_shape_and_stream_agree(server):
    url, _ = server
    r = _chat(url, logprobs=True, top_logprobs=2)
    assert r.status_code == 200, r.text
    body = r.json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] == 12
    assert b"".join(bytes(e["bytes"]) for e in content).decode("utf-8", "replace").startswith(
        body["choices"][0]["message"]["content"])
    for e in content:
        assert len(e["top_logprobs"]) == 2 and e["logprob"] <= 0
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert e["logprob"] == e["top_logprobs"][0]["logprob"]            # greedy: the most likely token
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 12,
                            "temperature": 0, "logprobs": True, "top_logprobs": 2, "stream": True}) as s:
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    streamed = [e for c in chunks for e in ((c["choices"][0].get("logprobs") or {}).get("content") or [])]
    assert streamed == content
    plain = _chat(url, logprobs=True, speculative={"method": "none"}).json()
    assert [e["logprob"] for e in plain["choices"][0]["logprobs"]["content"]] == [e["logprob"] for e in content]
    assert _chat(url).json()["choices"][0]["logprobs"] is None


def test_completion_logprobs_and_the_openai_client(server):
    from openai import OpenAI

    url, _ = server
    r = httpx.post(url + "/v1/completions", json={"prompt": "def add", "max_tokens": 6, "temperature": 0,
                                                 "logprobs": 2}, timeout=60)
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 6
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert all(math.isclose(max(d.values()), v) for d, v in zip(lp["top_logprobs"], lp["token_logprobs"]))
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                         temperature=0, logprobs=True, top_logprobs=1)
    entries = out.choices[0].logprobs.content
    assert len(entries) == 4 and entries[0].top_logprobs[0].token == entries[0].token
