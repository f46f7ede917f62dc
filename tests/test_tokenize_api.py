"""POST /tokenize and /detokenize in vLLM's shape (and llama-server's keys): the ids the server itself would use for
a prompt or a conversation, and back."""
from __future__ import annotations

import httpx
import pytest

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b): 你好"}]


@pytest.fixture(scope="module")
def served(draft_server):
    return draft_server[:2]


def test_a_prompt_and_a_conversation_are_the_ids_the_server_runs(served):
    url, llm = served
    tok = llm.tokenizer
    r = httpx.post(url + "/tokenize", json={"model": "tiny", "prompt": "def add(a, b):\n    return a + b"}).json()
    assert r["tokens"] == tok.encode("def add(a, b):\n    return a + b") and r["count"] == len(r["tokens"]) > 3
    assert r["max_model_len"] == httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"]
    # a conversation: exactly the prompt a chat completion of it counts
    chat = httpx.post(url + "/v1/chat/completions", json={"messages": CONVERSATION, "max_tokens": 1}).json()
    conv = httpx.post(url + "/tokenize", json={"messages": CONVERSATION}).json()
    assert conv["count"] == chat["usage"]["prompt_tokens"] and conv["tokens"] == tok.encode_chat(CONVERSATION)
    bare = httpx.post(url + "/tokenize", json={"messages": CONVERSATION, "add_generation_prompt": False}).json()
    assert bare["tokens"] == conv["tokens"][: bare["count"]] and bare["count"] < conv["count"]
    # llama-server's keys: content, with_pieces
    pieces = httpx.post(url + "/tokenize", json={"content": "def add", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tok.encode("def add") and "".join(p["piece"] for p in pieces) == "def add"
    strs = httpx.post(url + "/tokenize", json={"prompt": "def add", "return_token_strs": True}).json()["token_strs"]
    assert strs == [tok.id_to_token(i) for i in tok.encode("def add")]


def test_detokenize_is_the_inverse(served):
    url, llm = served
    ids = llm.tokenizer.encode("你好，世界！ def add(a, b):")
    r = httpx.post(url + "/detokenize", json={"model": "tiny", "tokens": ids}).json()
    assert r["prompt"] == r["content"] == "你好，世界！ def add(a, b):"


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, "messages"),
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {}, 400, None),
    ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
    ("/tokenize", {"messages": [{"role": "assistant", "content": "x"}, {"role": "bogus", "content": "y"}]}, 400,
     "messages.1.role"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, 400, "tokens"),
    ("/detokenize", {"tokens": "12"}, 400, "tokens"),
])
def test_bad_input_is_an_openai_error(served, path, body, status, param):
    r = httpx.post(served[0] + path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["param"] == param, err
