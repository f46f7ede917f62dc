"""OpenAI's Responses API (`POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`) for text and function tools.

A Responses request is turned into the chat completion it means (input items -> messages, `instructions` -> a
system message, function tools -> chat tools, `text.format` -> response_format, `max_output_tokens` ->
max_completion_tokens) and validated as one, so sampling, tools, grammars, speculation and errors are the chat
route's; what comes back is rendered as output items (a message, function calls), or streamed as the API's semantic
events. `previous_response_id` continues a stored conversation (kept in memory per tenant, bounded by count and
age); its next prompt extends the last one, so the prefix cache serves it as it serves a chat's next turn.
"""
from __future__ import annotations

import collections
import json
import threading
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from .admission import Submitted
from .api_errors import APIError, error_body, shown
from .async_engine import RequestAborted
from .protocol import ChatCompletionRequest
from .response_fields import speculative_stats
from .responses import CUT_MESSAGE, collect_all
from .responses_protocol import FunctionCallItem, MessageItem, ResponsesRequest
from .tools import ToolStream, parse_tool_calls

STORE_MAX = 1000              # responses kept for previous_response_id (the oldest go first)
STORE_TTL_S = 3600.0          # ... and for at most this long
# the chat fields a Responses request may carry as they are (OpenAI's sampling fields, vLLM's and ours)
PASSED = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "logit_bias", "min_tokens", "speculative", "spec_pool", "cache_salt", "ignore_eos")
RENAMED = {"messages": "input", "response_format": "text.format", "max_completion_tokens": "max_output_tokens"}


class ResponseStore:
    """Past responses by (tenant, id): the response object and the conversation it ends (chat messages, the
    instructions left out: OpenAI does not carry them to the next turn). Bounded by count and by age."""

    def __init__(self, max_items: int = STORE_MAX, ttl_s: float = STORE_TTL_S):
        self.max_items, self.ttl_s = max_items, ttl_s
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, tenant: str, response: dict, conversation: list[dict]) -> None:
        with self._lock:
            self._items[(tenant, response["id"])] = (time.monotonic(), response, conversation)
            self._evict()

    def get(self, tenant: str, rid: str) -> tuple[dict, list[dict]] | None:
        with self._lock:
            self._evict()
            item = self._items.get((tenant, rid))
            return None if item is None else (item[1], item[2])

    def delete(self, tenant: str, rid: str) -> bool:
        with self._lock:
            return self._items.pop((tenant, rid), None) is not None

    def _evict(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        while self._items and (len(self._items) > self.max_items or next(iter(self._items.values()))[0] < cutoff):
            self._items.popitem(last=False)


def new_id(prefix: str) -> str:
    """OpenAI's Responses ids: resp_..., msg_..., fc_..."""
    return f"{prefix}_{uuid.uuid4().hex}"


def not_found(rid: str) -> APIError:
    return APIError(404, f"Response with id '{shown(rid)}' not found.", "invalid_request_error",
                    param="previous_response_id", code="response_not_found")


def conversation_of(req: ResponsesRequest, previous: list[dict]) -> list[dict]:
    """The chat messages (OpenAI's chat shape) of the turns so far: the previous response's, then this input."""
    msgs = json.loads(json.dumps(previous))           # a copy: the stored turns stay as they were
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for item in items:
        if isinstance(item, MessageItem):
            msgs.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name,
                                                                          "arguments": item.arguments}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)          # parallel calls: one assistant turn
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            msgs.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return msgs


def chat_request(req: ResponsesRequest, conversation: list[dict]) -> ChatCompletionRequest:
    """The chat completion the Responses request means, validated as one (its errors named in Responses terms)."""
    body: dict[str, Any] = {"model": req.model, "stream": req.stream,
                            "messages": ([{"role": "system", "content": req.instructions}] if req.instructions
                                         else []) + conversation}
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                         for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice if isinstance(req.tool_choice, str) else \
            {"type": "function", "function": {"name": req.tool_choice.name}}
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise APIError(400, "text.format json_schema needs a schema", param="text.format.schema")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name or "output",
                                                                          "schema": fmt.schema_}}
    extra = req.model_extra or {}
    body |= {k: extra[k] for k in PASSED if k in extra}
    try:
        chat = ChatCompletionRequest.model_validate(body)
        chat.check_supported()
        return chat
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(x) for x in first.get("loc", ())]
        param = RENAMED.get(loc[0], loc[0]) if loc else None
        raise APIError(400, f"{param}: {first.get('msg', 'invalid value')}" if param else "invalid request",
                       param=param) from None
    except APIError as exc:
        exc.param = RENAMED.get(exc.param, exc.param)
        raise


def _usage(stats) -> dict:
    return {"input_tokens": stats.prompt_tokens, "input_tokens_details": {"cached_tokens": stats.cached_tokens},
            "output_tokens": stats.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stats.prompt_tokens + stats.completion_tokens}


def _message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or new_id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def _call_item(call: dict, arguments: str | None = None, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "function_call", "id": item_id or new_id("fc"), "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] if arguments is None else arguments, "status": status}


class Turn:
    """One Responses request in flight: the frame of its response object, and what is stored when it ends."""

    def __init__(self, req: ResponsesRequest, model: str, conversation: list[dict]):
        self.req, self.conversation = req, conversation
        self.id, self.created = new_id("resp"), int(time.time())
        self.model = model

    def frame(self, status: str, output: list[dict], stats=None, finish: str | None = None,
              seed_scope: str | None = None) -> dict:
        r = self.req
        incomplete = {"reason": "max_output_tokens"} if finish == "length" else None
        out = {"id": self.id, "object": "response", "created_at": self.created,
               "status": "incomplete" if incomplete and status == "completed" else status,
               "incomplete_details": incomplete, "error": None, "model": self.model, "output": output,
               "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
               "temperature": (r.model_extra or {}).get("temperature", 1.0),
               "top_p": (r.model_extra or {}).get("top_p", 1.0),
               "tools": [t.model_dump(exclude_none=True) for t in r.tools or []],
               "tool_choice": (r.tool_choice if isinstance(r.tool_choice, str) or r.tool_choice is None
                               else r.tool_choice.model_dump()) or "auto",
               "parallel_tool_calls": r.parallel_tool_calls if r.parallel_tool_calls is not None else True,
               "text": {"format": (r.text.format.model_dump(by_alias=True, exclude_none=True)
                                   if r.text is not None and r.text.format is not None else {"type": "text"})},
               "previous_response_id": r.previous_response_id, "store": r.store, "metadata": r.metadata or {},
               "usage": _usage(stats) if stats is not None else None}
        if stats is not None:
            out["speculative"] = speculative_stats(stats, seed_scope)
        return out

    def conversation_after(self, output: list[dict]) -> list[dict]:
        """The stored conversation: this turn's messages, then its answer as chat messages."""
        msgs = list(self.conversation)
        calls = [{"id": o["call_id"], "type": "function", "function": {"name": o["name"],
                                                                       "arguments": o["arguments"]}}
                 for o in output if o["type"] == "function_call"]
        text = "".join(p["text"] for o in output if o["type"] == "message" for p in o["content"])
        msgs.append({"role": "assistant", "content": text or None} | ({"tool_calls": calls} if calls else {}))
        return msgs


def output_items(text: str, names: set[str] | None) -> list[dict]:
    content, calls = parse_tool_calls(text, names) if names is not None else (text, [])
    items = [_message_item(content)] if content or not calls else []
    return items + [_call_item(c) for c in calls]


async def respond_turn(state, store: ResponseStore, tenant: str, turn: Turn, chat: ChatCompletionRequest,
                       sub: Submitted, raw: Request):
    mode = chat.tool_mode
    names = {t["function"]["name"] for t in mode.tools} if mode is not None else None
    handle = sub.handles[0]
    if turn.req.stream:
        return StreamingResponse(_events(store, tenant, turn, handle, names, sub.seed_scope),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    results = await collect_all([handle], raw)
    if results is None:
        return Response(status_code=499)
    text, final, _, _ = results[0]
    output = output_items(text, names)
    body = turn.frame("completed", output, final.stats, final.finish_reason, sub.seed_scope)
    if turn.req.store:
        store.put(tenant, body, turn.conversation_after(output))
    return JSONResponse(body)


async def _events(store: ResponseStore, tenant: str, turn: Turn, handle, names: set[str] | None,
                  seed_scope: str | None):
    """The Responses stream: response.created and .in_progress; the message's output_item.added,
    content_part.added, output_text.delta ..., output_text.done, content_part.done, output_item.done; a call's
    output_item.added, function_call_arguments.delta and .done, output_item.done; response.completed."""
    seq = 0

    def event(kind: str, **fields) -> str:
        nonlocal seq
        data = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    output: list[dict] = []
    message: dict | None = None                   # the message item being streamed
    parts: list[str] = []
    tools = ToolStream(names) if names is not None else None

    def open_message():
        nonlocal message
        message = _message_item("", "in_progress")
        output.append(message)
        return [event("response.output_item.added", output_index=len(output) - 1, item=message),
                event("response.content_part.added", item_id=message["id"], output_index=len(output) - 1,
                      content_index=0, part={"type": "output_text", "text": "", "annotations": []})]

    def close_message():
        nonlocal message
        text = "".join(parts)
        i = output.index(message)
        part = {"type": "output_text", "text": text, "annotations": []}
        done = _message_item(text, "completed", message["id"])
        output[i] = done
        message = None
        return [event("response.output_text.done", item_id=done["id"], output_index=i, content_index=0, text=text),
                event("response.content_part.done", item_id=done["id"], output_index=i, content_index=0, part=part),
                event("response.output_item.done", output_index=i, item=done)]

    def call_events(call: dict):
        item = _call_item(call, "", "in_progress")
        output.append(item)
        i = len(output) - 1
        args = call["function"]["arguments"]
        done = _call_item(call, None, "completed", item["id"])
        output[i] = done
        return [event("response.output_item.added", output_index=i, item=item),
                event("response.function_call_arguments.delta", item_id=item["id"], output_index=i, delta=args),
                event("response.function_call_arguments.done", item_id=item["id"], output_index=i, arguments=args),
                event("response.output_item.done", output_index=i, item=done)]

    try:
        yield event("response.created", response=turn.frame("in_progress", []))
        yield event("response.in_progress", response=turn.frame("in_progress", []))
        async for d in handle.deltas():
            text, calls = d.text, []
            if tools is not None:
                text, calls = tools.feed(d.text)
                if d.finished:
                    rest, more = tools.finish()
                    text, calls = text + rest, calls + more
            if text:
                if message is None:
                    for e in open_message():
                        yield e
                parts.append(text)
                yield event("response.output_text.delta", item_id=message["id"], output_index=output.index(message),
                            content_index=0, delta=text)
            for call in calls:
                if message is not None:
                    for e in close_message():
                        yield e
                    parts = []
                for e in call_events(call):
                    yield e
            if d.finished:
                if message is None and not output:
                    for e in open_message():             # an empty answer is still one message
                        yield e
                if message is not None:
                    for e in close_message():
                        yield e
                body = turn.frame("completed", output, d.stats, d.finish_reason, seed_scope)
                if turn.req.store:
                    store.put(tenant, body, turn.conversation_after(output))
                kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
                yield event(kind, response=body)
    except RequestAborted:
        yield event("error", **error_body(CUT_MESSAGE, "server_error", code="server_shutting_down")["error"])
    except Exception as exc:  # noqa: BLE001 - an error event; never a silent truncation
        yield event("error", **error_body(f"generation failed: {type(exc).__name__}: {exc}",
                                          "internal_error")["error"])
    finally:
        handle.abort()
