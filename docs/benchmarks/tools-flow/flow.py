"""The OpenAI tool-calling flow against a running `specdec serve` (default pair), written to flow.md beside this file.

    specdec serve --port 8123 &
    python docs/benchmarks/tools-flow/flow.py http://127.0.0.1:8123
"""
import json
import sys
from pathlib import Path

from openai import OpenAI

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}


def main(url: str) -> None:
    client = OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    log = [f"# Tool-calling flow against `{url}` (model `{model}`, temperature 0)", ""]

    def show(title, obj):
        log.extend([f"## {title}", "", "```json", json.dumps(obj, indent=2, ensure_ascii=False), "```", ""])

    msgs = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
    for stream in (False, True):
        kw = dict(model=model, messages=msgs, tools=[WEATHER], max_tokens=128, temperature=0)
        if not stream:
            out = client.chat.completions.create(**kw)
            show("1. the question, tools=[get_weather], tool_choice auto: the response", out.model_dump(exclude_none=True))
            call = out.choices[0].message.tool_calls[0]
        else:
            chunks = [c.model_dump(exclude_none=True) for c in client.chat.completions.create(stream=True, **kw)]
            show("2. the same, streamed: the chunks that carry tool_calls and the finish", [
                c for c in chunks if c["choices"] and (c["choices"][0]["delta"].get("tool_calls")
                                                       or c["choices"][0].get("finish_reason"))])
    result = {"temperature_c": 18, "sky": "cloudy", "wind_kph": 12}
    msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]
    final = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER], tool_choice="none",
                                           max_tokens=96, temperature=0)
    show("3. the tool's result sent back (tool_choice none): the answer", final.model_dump(exclude_none=True))
    forced = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                            tools=[WEATHER], tool_choice="required", max_tokens=96, temperature=0)
    show("4. tool_choice required: a call enforced by the grammar", forced.model_dump(exclude_none=True))
    Path(__file__).with_name("flow.md").write_text("\n".join(log))
    print("\n".join(log))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8123")
