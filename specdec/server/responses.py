"""A submitted request's way out: one JSON response, or an SSE stream of chunks, in OpenAI's shape (tool calls,
logprobs, usage, the per-request `speculative` stats), ending cleanly when the client leaves or the server drains."""
from __future__ import annotations

import asyncio
import json
import logging

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .async_engine import RequestAborted
from .engine_client import RequestStream
from .protocol import APIError, error_body
from .response_fields import completion_logprobs, logprobs_content, new_id, now, speculative_stats, usage
from .state import ServerState
from .tools import ToolStream, parse_tool_calls

log = logging.getLogger("specdec.server")


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


CUT_MESSAGE = "the server shut down before this request finished (--drain-timeout reached)"


async def respond(state: ServerState, req, handle: RequestStream, raw: Request, chat: bool,
                   seed_scope: str | None = None):
    rid = new_id("chatcmpl" if chat else "cmpl")
    created, model = now(), state.served_model_name
    obj = "chat.completion" if chat else "text_completion"
    where = {"x-specdec-replica": handle.replica} if handle.replica else {}     # which engine replica decoded it
    if raw.headers.get("x-request-id"):
        where["x-request-id"] = raw.headers["x-request-id"][:256]
    want_lp = req.logprobs_count() is not None
    tok = state.engine.tokenizer
    mode = req.tool_mode if chat else None
    tool_calls = mode is not None                          # parse the output for calls
    names = {t["function"]["name"] for t in mode.tools} if mode is not None else None
    predicted = getattr(req, "prediction", None) is not None
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(stream(handle, rid, created, model, chat, include_usage, seed_scope,
                                         tok if want_lp else None,
                                         ToolStream(names) if tool_calls else None, predicted),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache", **where})
    task = asyncio.ensure_future(collect(handle))
    try:
        while True:                                # a client that goes away aborts its request
            done, _ = await asyncio.wait({task}, timeout=0.2)
            if done:
                break
            if await raw.is_disconnected():
                handle.abort()
                task.cancel()
                return Response(status_code=499)
        text, final, lps = task.result()
    except RequestAborted:
        raise APIError(503, CUT_MESSAGE, "server_error", code="server_shutting_down") from None
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - engine error for this request only
        raise APIError(500, f"generation failed: {type(exc).__name__}: {exc}", "internal_error") from None
    finally:
        handle.abort()                             # no-op when finished
    stats = final.stats
    logprobs = None
    if want_lp:
        logprobs = {"content": logprobs_content(tok, lps)} if chat else completion_logprobs(tok, lps)[0]
    message, finish = {"role": "assistant", "content": text}, final.finish_reason
    if tool_calls:
        content, calls = parse_tool_calls(text, names)
        if calls:
            message = {"role": "assistant", "content": content, "tool_calls": calls}
            finish = "tool_calls" if finish == "stop" else finish
    choice = ({"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs} if chat else
              {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs})
    return JSONResponse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
                         "usage": usage(stats, predicted),
                         "speculative": speculative_stats(stats, seed_scope)}, headers=where)


async def collect(handle: RequestStream):
    parts, final, lps = [], None, []
    async for d in handle.deltas():
        parts.append(d.text)
        lps += d.logprobs or []
        final = d
    return "".join(parts), final, lps


async def stream(handle: RequestStream, rid: str, created: int, model: str, chat: bool, include_usage: bool,
                  seed_scope: str | None = None, lp_tokenizer=None, tools: ToolStream | None = None,
                  predicted: bool = False):
    """lp_tokenizer: set when the request asked for logprobs: each chunk carries those of its tokens.
    tools: a ToolStream when the output is parsed for tool calls (sent as delta.tool_calls)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    offset = 0

    def calls_chunk(calls: list[dict]) -> dict:
        return {"id": rid, "object": obj, "created": created, "model": model,
                "choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None, "logprobs": None}]}

    def chunk(text: str | None, finish_reason=None, role=False, lps=None) -> dict:
        nonlocal offset
        logprobs = None
        if lp_tokenizer is not None and not role:
            if chat:
                logprobs = {"content": logprobs_content(lp_tokenizer, lps or [])}
            else:
                logprobs, offset = completion_logprobs(lp_tokenizer, lps or [], offset)
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": logprobs}
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}

    try:
        if chat:
            yield sse(chunk(None, role=True))
        async for d in handle.deltas():
            text, reason = d.text, d.finish_reason
            if tools is not None:
                text, calls = tools.feed(d.text)
                if calls:
                    yield sse(calls_chunk(calls))
                if d.finished:
                    rest, calls = tools.finish()
                    text += rest
                    if calls:
                        yield sse(calls_chunk(calls))
                    reason = "tool_calls" if tools.num_calls and reason == "stop" else reason
            if d.finished:
                last = chunk(text or None, reason, lps=d.logprobs)
                last["speculative"] = speculative_stats(d.stats, seed_scope)
                yield sse(last)
                if include_usage:
                    yield sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                                "usage": usage(d.stats, predicted)})
            elif text or (lp_tokenizer is not None and d.logprobs):
                yield sse(chunk(text, lps=d.logprobs))
        yield "data: [DONE]\n\n"
    except RequestAborted:
        yield sse(error_body(CUT_MESSAGE, "server_error", code="server_shutting_down"))
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - an error event, then [DONE]; never a silent truncation
        yield sse(error_body(f"generation failed: {type(exc).__name__}: {exc}", "internal_error"))
        yield "data: [DONE]\n\n"
    finally:
        handle.abort()                             # client gone mid-stream: stop decoding within one step
