"""The `openai` package against a live `specdec serve` on the tiny pair: chat, completions and the Responses API,
sync, async and streamed; the Responses API's answers equal chat's for the same messages (greedy)."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai  # noqa: E402 - in the test extras: these tests never skip
import pytest

PROMPT = "def add(a, b):"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
           "additionalProperties": False}


@pytest.fixture(scope="module")
def served(draft_server):
    return draft_server[0]


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0)


def test_chat_and_completions_sync_async_and_streamed(served, client):
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=12, temperature=0, n=2, frequency_penalty=0.5)
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0,
        frequency_penalty=0.5, stream=True) if c.choices)
    assert streamed == chat.choices[0].message.content
    comp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    assert comp.choices[0].text == PROMPT and comp.choices[0].logprobs.token_logprobs[0] is None

    async def run():
        aclient = openai.AsyncOpenAI(base_url=served + "/v1", api_key="unused", max_retries=0)
        r = await aclient.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                                  max_tokens=12, temperature=0, frequency_penalty=0.5)
        s = await aclient.responses.create(model="tiny", input=PROMPT, max_output_tokens=12, temperature=0,
                                           stream=True)
        kinds = [e.type async for e in s]
        await aclient.close()
        return r.choices[0].message.content, kinds

    text, kinds = asyncio.run(run())
    assert text == chat.choices[0].message.content
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")


def test_responses_text_equals_chat_and_continues_a_conversation(client):
    resp = client.responses.create(model="tiny", input=PROMPT, instructions="Be brief.", max_output_tokens=16,
                                   temperature=0)
    chat = client.chat.completions.create(model="tiny", max_tokens=16, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}])
    assert resp.object == "response" and resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens and resp.usage.output_tokens > 0
    assert resp.status in ("completed", "incomplete")
    # the next turn: previous_response_id carries the conversation (the instructions are not carried: OpenAI's)
    nxt = client.responses.create(model="tiny", input="And mul?", previous_response_id=resp.id,
                                  max_output_tokens=8, temperature=0)
    chat2 = client.chat.completions.create(model="tiny", max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": PROMPT}, {"role": "assistant", "content": resp.output_text},
        {"role": "user", "content": "And mul?"}])
    assert nxt.output_text == chat2.choices[0].message.content
    assert nxt.usage.input_tokens_details.cached_tokens > 0          # the prefix cache served the earlier turn
    assert client.responses.retrieve(resp.id).output_text == resp.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="x", previous_response_id="resp_nope")


def test_responses_streamed_events_build_the_same_text(client):
    whole = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=16, temperature=0)
    events = list(client.responses.create(model="tiny", input=PROMPT, max_output_tokens=16, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    for k in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
              "response.output_text.done", "response.output_item.done"):
        assert k in kinds, k
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_function_tool_and_json_schema(client):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}]
    r = client.responses.create(model="tiny", input="Weather in Paris?", tools=tools, tool_choice="required",
                                max_output_tokens=120, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
    events = list(client.responses.create(model="tiny", input="Weather in Paris?", tools=tools,
                                          tool_choice="required", max_output_tokens=120, temperature=0, stream=True))
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert deltas and json.loads("".join(e.delta for e in deltas)) == json.loads(calls[0].arguments)
    # the call's result, sent back as a function_call_output item, continues the conversation
    after = client.responses.create(model="tiny", previous_response_id=r.id, max_output_tokens=8, temperature=0,
                                    input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                            "output": "sunny"}])
    assert after.status in ("completed", "incomplete")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    r = client.responses.create(model="tiny", input="A digit:", max_output_tokens=40, temperature=0,
                                text={"format": {"type": "json_schema", "name": "digit", "schema": schema}})
    assert 0 <= json.loads(r.output_text)["n"] <= 9


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"), ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
                                "input.0.content"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format.schema"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
])
def test_bad_responses_requests_are_openai_errors(served, body, param):
    r = httpx.post(served + "/v1/responses", json=body, timeout=30)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param, r.text
