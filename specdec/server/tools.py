"""Tool calls in the Qwen / Hermes format: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

- The request's tools reach the model through its own chat template (`tools`), the conversation's earlier calls as
  `tool_calls` with their arguments as objects (what templates expect; OpenAI sends them as JSON strings).
- `tool_choice` "auto": the output is parsed for calls; "none": tools are left out of the prompt and nothing is
  parsed; "required" or a named function: a grammar makes the output one call (of any given function, or of
  that one) whose arguments follow the function's JSON schema: enforced by constrained decoding, not hoped for.
- Streaming: text is streamed as content until `<tool_call>` begins (a possible start of it is held back); a
  call is sent as one `delta.tool_calls` entry once its closing tag arrives (OpenAI's clients concatenate argument
  fragments, so one fragment is a valid stream).
"""
from __future__ import annotations

import json
import re
import uuid

from ..sampling.grammar import JSON_STYLE, StructuredOutputs

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def template_messages(messages: list) -> list[dict]:
    """Request messages -> chat-template messages (tool calls' arguments as objects, tool results' ids kept)."""
    out = []
    for m in messages:
        msg = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                args = c.function.arguments
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except json.JSONDecodeError:
                    pass                                 # a template writes the string as it is
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                           "arguments": args}})
            msg["tool_calls"] = calls
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


def call_grammar(tools: list[dict], name: str | None) -> StructuredOutputs:
    """One tool call (of the function `name`, or of any of `tools`), its arguments valid for the function's schema."""
    funcs = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    rules = []
    for i, f in enumerate(funcs):
        params = f.get("parameters") or {"type": "object", "properties": {}}
        schema = {"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                  "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_STYLE}
        rules.append(f'call{i}: "{OPEN}\\n" %json {json.dumps(schema)} "\\n{CLOSE}"')
    start = "start: " + " | ".join(f"call{i}" for i in range(len(funcs)))
    return StructuredOutputs(grammar="\n".join([start, *rules]))


def _call_from(body: str) -> dict | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": call_id(), "type": "function", "function": {"name": obj["name"], "arguments": args}}


_FENCED = re.compile(r"^\s*(?:```(?:json)?\s*)?(\{.*\})\s*(?:```)?\s*$", re.DOTALL)
_CALL_STARTS = ('```json{"name":"', '```{"name":"', '{"name":"')


def _bare_call(text: str, names: set[str] | None) -> dict | None:
    """The whole output as one call written without the tags (bare or in a ```json fence), as small models often
    write them (llama.cpp accepts these for Hermes-style models too); only for a function of this request."""
    m = _FENCED.match(text) if names else None
    call = _call_from(m.group(1)) if m else None
    return call if call is not None and call["function"]["name"] in names else None


def parse_tool_calls(text: str, names: set[str] | None = None) -> tuple[str | None, list[dict]]:
    """Whole output -> (content without the calls, or None when nothing else was said; the calls). `names`: the
    request's functions (enables the untagged whole-output form)."""
    bare = _bare_call(text, names) if OPEN not in text else None
    if bare is not None:
        return None, [bare]
    calls, kept, at = [], [], 0
    for m in _CALL.finditer(text):
        call = _call_from(m.group(1))
        if call is None:
            continue                                      # not a call after all: it stays in the content
        kept.append(text[at:m.start()])
        at = m.end()
        calls.append(call)
    kept.append(text[at:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


class ToolStream:
    """Incremental parse of streamed text: `feed` returns (content to send, completed calls); `finish` flushes.
    With `names`, an output that begins like an untagged call (`{"name": "` or a ```json fence) is held back until
    it ends, then sent as a call if it is one, else as content."""

    def __init__(self, names: set[str] | None = None):
        self.buf = ""
        self.in_call = False
        self.num_calls = 0
        self.names = names
        self.bare = "undecided" if names else "no"     # undecided | yes (buffer to the end) | no

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self.buf += text
        if self.bare != "no" and OPEN not in self.buf:
            squeezed = "".join(self.buf.split())
            if any(squeezed.startswith(t) for t in _CALL_STARTS):
                self.bare = "yes"
            elif not any(t.startswith(squeezed) for t in _CALL_STARTS):
                self.bare = "no"
            if self.bare != "no":
                return "", []
        self.bare = "no"
        content, calls = [], []
        while True:
            if self.in_call:
                end = self.buf.find(CLOSE)
                if end < 0:
                    break
                body, self.buf, self.in_call = self.buf[:end], self.buf[end + len(CLOSE):], False
                call = _call_from(body.strip())
                if call is None:
                    content.append(OPEN + body + CLOSE)
                else:
                    calls.append(call | {"index": self.num_calls})
                    self.num_calls += 1
                continue
            start = self.buf.find(OPEN)
            if start >= 0:
                content.append(self.buf[:start])
                self.buf, self.in_call = self.buf[start + len(OPEN):], True
                continue
            keep = _partial_suffix(self.buf, OPEN)     # may be the start of a call: hold it back
            content.append(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            break
        text = "".join(content)
        if self.num_calls and not text.strip():
            text = ""                                   # newlines between calls are not content
        return text, calls

    def finish(self) -> tuple[str, list[dict]]:
        """What is left when the output ends: text (an unclosed call is text) and an untagged call, if it was one."""
        if self.bare != "no":
            call = _bare_call(self.buf, self.names)
            rest, self.buf, self.bare = self.buf, "", "no"
            if call is not None:
                self.num_calls += 1
                return "", [call | {"index": 0}]
            return rest, []
        rest = (OPEN + self.buf) if self.in_call else self.buf
        self.buf, self.in_call = "", False
        return ("" if self.num_calls and not rest.strip() else rest), []


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
