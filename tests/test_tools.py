"""Tool calls: the Qwen/Hermes format parsed whole and streamed, the openai client's flow against the server,
`required` and named functions enforced by the grammar."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from server_utils import draft_llm, running_server

from specdec import SpeculativeConfig
from specdec.server.tools import ToolStream, parse_tool_calls

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}},
                                       "required": ["zone"], "additionalProperties": False}}}

TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


def test_parse_whole_output():
    content, calls = parse_tool_calls(TEXT)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert parse_tool_calls("plain answer") == ("plain answer", [])
    bad = "<tool_call>\nnot json\n</tool_call>"
    assert parse_tool_calls(bad) == (bad, [])
    assert parse_tool_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}")[1] == []   # cut before it closed


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 11, 1000])
def test_streamed_parse_matches_the_whole(step):
    stream, content, calls = ToolStream(), "", []
    for i in range(0, len(TEXT), step):
        text, new = stream.feed(TEXT[i:i + step])
        assert "<" not in text or "<tool" not in text
        content += text
        calls += new
    content += stream.finish()[0]
    whole_content, whole_calls = parse_tool_calls(TEXT)
    assert content.strip() == whole_content
    assert [(c["index"], c["function"]) for c in calls] == [(i, c["function"]) for i, c in enumerate(whole_calls)]
    stream = ToolStream()
    assert stream.feed("a <tool") == ("a ", []) and stream.finish() == ("<tool", [])      # held back, then given


BARE = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris", "unit": "celsius"}\n}\n```'


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_an_untagged_call_of_a_given_function_is_a_call(step):
    names = {"get_weather"}
    content, calls = parse_tool_calls(BARE, names)
    assert content is None and calls[0]["function"]["name"] == "get_weather"
    assert parse_tool_calls(BARE, {"other"}) == (BARE, [])                     # not one of this request's tools
    assert parse_tool_calls(BARE) == (BARE, [])
    stream, sent, got = ToolStream(names), "", []
    for i in range(0, len(BARE), step):
        text, new = stream.feed(BARE[i:i + step])
        sent += text
        got += new
    rest, new = stream.finish()
    assert sent + rest == "" and [c["function"]["name"] for c in got + new] == ["get_weather"]
    code = "```python\nprint(1)\n```"
    stream = ToolStream(names)
    assert "".join(stream.feed(ch)[0] for ch in code) + stream.finish()[0] == code
    assert stream.feed("x")[0] == "x"                                           # decided early: streams on


@pytest.fixture(scope="module")
def server(tiny_dirs):
    with running_server(draft_llm(tiny_dirs), SpeculativeConfig(method="draft", num_speculative_tokens=3)) as (url, _):
        yield url


def _client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_flow_with_a_named_function(server, stream):
    client = _client(server)
    kw = dict(model="tiny", messages=MSGS, tools=[WEATHER, TIME], max_tokens=120, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    if stream:
        calls, finish = {}, None
        for c in client.chat.completions.create(stream=True, **kw):
            if not c.choices:
                continue
            for d in c.choices[0].delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
                entry["arguments"] += d.function.arguments or ""
            finish = c.choices[0].finish_reason or finish
        assert finish == "tool_calls" and len(calls) == 1
        call = calls[0]
    else:
        out = client.chat.completions.create(**kw)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        tc = choice.message.tool_calls[0]
        call = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    args = json.loads(call["arguments"])
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    # the tool's result goes back; the model answers in text
    history = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": 18})}]
    final = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER, TIME], max_tokens=8,
                                           temperature=0, tool_choice="none")
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content


def test_required_calls_one_of_the_tools(server):
    out = _client(server).chat.completions.create(model="tiny", messages=MSGS, tools=[WEATHER, TIME],
                                                  tool_choice="required", max_tokens=120, temperature=0.9, seed=3)
    tc = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls" and len(tc) == 1
    tool = {"get_weather": WEATHER, "get_time": TIME}[tc[0].function.name]
    jsonschema.validate(json.loads(tc[0].function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
])
def test_bad_tool_requests_are_400(server, body, param):
    r = httpx.post(server + "/v1/chat/completions", json={"messages": MSGS, **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.real_models
def test_real_pair_tool_flow():
    """The default pair as `specdec serve` runs it (int4 target) through the openai client: it calls the tool on its
    own (tool_choice auto), the result goes back, and it answers in text. Prompt lookup speculates (the policy is
    tested on the tiny pair)."""
    from specdec import LLM

    llm = LLM(speculative=SpeculativeConfig(method="ngram"), quantization="int4", progress=False)
    with running_server(llm, SpeculativeConfig(method="ngram"), name="qwen") as (url, _):
        client = _client(url)
        msgs = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
        out = client.chat.completions.create(model="qwen", messages=msgs, tools=[WEATHER], max_tokens=96,
                                             temperature=0)
        assert out.choices[0].finish_reason == "tool_calls", out.choices[0].message
        tc = out.choices[0].message.tool_calls[0]
        assert tc.function.name == "get_weather" and json.loads(tc.function.arguments)["city"] == "Paris"
        msgs += [{"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]},
                 {"role": "tool", "tool_call_id": tc.id, "content": '{"temperature_c": 18, "sky": "cloudy"}'}]
        stream = client.chat.completions.create(model="qwen", messages=msgs, tools=[WEATHER], tool_choice="none",
                                                max_tokens=48, temperature=0, stream=True)
        answer = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert "18" in answer, answer
