"""The sampling fields clients send, through a live server: n (one prefill shared), penalties and logit_bias (exact
under speculation), min_tokens, and completions' echo with logprobs (the prompt scored, max_tokens 0)."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from specdec.models.runner import forward_once
from specdec.server.protocol import REFUSED_FIELDS, refused_markdown

PROMPT = "def add(a, b):\n    return a + b\n\ndef mul(a, b):"


@pytest.fixture(scope="module")
def served(draft_server):
    return draft_server


def _chat(url, **body):
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}], **body},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_n_greedy_choices_are_one_prefill_and_equal(served):
    url, llm, _ = served
    cold = PROMPT + " # n=4"                         # a prompt no earlier request cached
    r = httpx.post(url + "/v1/completions", json={"prompt": cold, "max_tokens": 12, "temperature": 0, "n": 4},
                   timeout=60).json()
    texts = [c["text"] for c in r["choices"]]
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3] and len(set(texts)) == 1
    n_prompt = len(llm.tokenizer.encode(cold))
    assert r["usage"]["prompt_tokens"] == n_prompt
    assert r["usage"]["completion_tokens"] % 4 == 0 and r["usage"]["completion_tokens"] > 0
    # the first choice computed the prompt, the other three copied it: all but the last prompt token
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1


def test_n_sampled_with_a_seed_is_reproducible_and_varied(served):
    url, _, _ = served
    body = {"max_tokens": 10, "temperature": 1.0, "seed": 7, "n": 4}
    a, b = _chat(url, **body), _chat(url, **body)
    texts = [c["message"]["content"] for c in a["choices"]]
    assert texts == [c["message"]["content"] for c in b["choices"]]
    assert len(set(texts)) > 1                       # choice i samples with seed + i


def test_n_streams_every_choice_by_index(served):
    url, _, _ = served
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0, "n": 3,
            "stream": True, "stream_options": {"include_usage": True}}
    parts, finished, usage = {}, set(), None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                parts[c["index"]] = parts.get(c["index"], "") + (c["delta"].get("content") or "")
                if c["finish_reason"]:
                    finished.add(c["index"])
    assert finished == {0, 1, 2} and len(set(parts.values())) == 1 and parts[0]
    assert usage["completion_tokens"] == 3 * 8


def test_penalties_and_bias_are_exact_under_speculation(served):
    url, llm, _ = served
    bias_id = llm.tokenizer.encode(" return")[0]
    body = {"max_tokens": 24, "temperature": 0, "frequency_penalty": 0.7, "presence_penalty": 0.4,
            "repetition_penalty": 1.3, "logit_bias": {str(bias_id): -100}, "min_tokens": 5}
    off = _chat(url, speculative={"method": "none"}, **body)
    for method in ("draft", "ngram", "suffix"):
        on = _chat(url, speculative={"method": method, "num_speculative_tokens": 3}, **body)
        assert on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"], method
    plain = _chat(url, max_tokens=24, temperature=0)
    assert plain["choices"][0]["message"]["content"] != off["choices"][0]["message"]["content"]


def test_a_bias_of_minus_100_keeps_a_token_out_of_sampled_answers(served):
    url, llm, _ = served
    plain = _chat(url, max_tokens=16, temperature=0)
    banned = llm.tokenizer.encode(plain["choices"][0]["message"]["content"])[0]    # the likeliest first token
    r = _chat(url, max_tokens=6, temperature=1.0, seed=3, n=100, logit_bias={str(banned): -100},
              logprobs=True)
    seen = [t["bytes"] for c in r["choices"] for t in c["logprobs"]["content"]]
    assert len(r["choices"]) == 100 and len(seen) >= 100
    assert list(llm.tokenizer.token_bytes(banned)) not in seen


def test_echo_scores_the_prompt_as_a_plain_forward(served):
    url, llm, _ = served
    ids = llm.tokenizer.encode(PROMPT)
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1,
                                                  "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["text"] == PROMPT and c["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 0
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # a plain forward of the fp32 target over the whole prompt, in a cache of its own
    logits = forward_once(llm.target.model, ids).float()[:, :llm.tokenizer.vocab_size]   # the model's padding cut
    want = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"][1:], want)) < 1e-5
    # with a completion: the prompt, then the answer (its logprobs after the prompt's)
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "echo": True, "logprobs": 0,
                                                  "temperature": 0}, timeout=60).json()["choices"][0]
    assert r["text"].startswith(PROMPT) and len(r["logprobs"]["tokens"]) == len(ids) + 4
    assert max(abs(a - b) for a, b in zip(r["logprobs"]["token_logprobs"][1:len(ids)], want)) < 1e-5


def test_echo_streams_the_prompt_first(served):
    url, _, _ = served
    body = {"prompt": PROMPT, "max_tokens": 4, "echo": True, "temperature": 0, "stream": True}
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    text += c["text"]
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)


@pytest.mark.parametrize("body, param", [
    ({"frequency_penalty": 2.5}, "frequency_penalty"), ({"presence_penalty": -2.1}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 200}}, "logit_bias"), ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 50, "max_tokens": 10}, "min_tokens"),
    ({"n": 0}, "n"), ({"n": 129}, "n"), ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_values_are_a_400_naming_the_field(served, body, param):
    r = httpx.post(served[0] + "/v1/completions", json={"prompt": "x", **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("route, field", [(r, f) for r, fields in REFUSED_FIELDS.items() for f in fields])
def test_each_refused_field_is_refused_and_its_harmless_value_passes(served, route, field):
    bad, ok = REFUSED_FIELDS[route][field]
    path, base = (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}) if route == "chat"
                  else ("/v1/completions", {"prompt": "x"}))
    r = httpx.post(served[0] + path, json={**base, "max_tokens": 2, field: bad}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert r.json()["error"]["code"] == "unsupported_parameter"
    r = httpx.post(served[0] + path, json={**base, "max_tokens": 2, field: ok}, timeout=30)
    assert r.status_code == 200, r.text


def test_readme_lists_exactly_the_refused_fields():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = readme.split("<!-- refused -->\n")[1].split("  <!-- /refused -->")[0]
    assert [line.strip() for line in block.splitlines()] == refused_markdown().splitlines()
