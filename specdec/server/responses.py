"""A submitted request's way out: one JSON response, or an SSE stream of chunks, in OpenAI's shape (tool calls,
logprobs, usage, the per-request `speculative` stats), ending cleanly when the client leaves or the server drains."""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .admission import Submitted
from .api_errors import APIError, error_body
from .async_engine import RequestAborted
from .engine_client import RequestStream
from .response_fields import completion_logprobs, logprobs_content, new_id, now, speculative_stats, usage
from .state import ServerState
from .tools import ToolStream, parse_tool_calls

log = logging.getLogger("specdec.server")


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


CUT_MESSAGE = "the server shut down before this request finished (--drain-timeout reached)"


@dataclass
class Echo:
    """Completions' `echo`: the prompt's text and tokens before each choice's text; `scored_only` (max_tokens 0):
    the prompt alone, the token the engine sampled after it left out."""
    text: str
    prompt_ids: list[int]
    scored_only: bool

    def logprobs(self, tok, prompt_lps: list, lps: list) -> dict:
        """Completions' logprobs over the prompt's tokens (the first has none: null, as OpenAI's) and then the
        choice's."""
        first = tok.token_bytes(self.prompt_ids[0]).decode("utf-8", "replace")
        head = {"tokens": [first], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]}
        rest, offset = completion_logprobs(tok, (prompt_lps or [None])[1:], len(first))
        tail, _ = completion_logprobs(tok, [] if self.scored_only else lps, offset)
        return {k: head[k] + rest[k] + tail[k] for k in head}


def echo_of(state: ServerState, req, sub: Submitted) -> Echo | None:
    if not getattr(req, "echo", False):
        return None
    prompt = req.prompt[0] if isinstance(req.prompt, list) and isinstance(req.prompt[0], (str, list)) else req.prompt
    text = prompt if isinstance(prompt, str) else state.engine.tokenizer.decode(prompt, skip_special_tokens=False)
    return Echo(text, sub.prompt_ids, req.max_tokens == 0)


async def respond(state: ServerState, req, sub: Submitted, raw: Request, chat: bool, echo: bool = False):
    """One response for a request's choices (n handles, one per choice: index i is sub.handles[i])."""
    handles, seed_scope = sub.handles, sub.seed_scope
    ech = echo_of(state, req, sub) if echo else None
    rid = new_id("chatcmpl" if chat else "cmpl")
    created, model = now(), state.served_model_name
    obj = "chat.completion" if chat else "text_completion"
    first = handles[0]
    where = {"x-specdec-replica": first.replica} if first.replica else {}     # which engine replica decoded it
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
        return StreamingResponse(stream(handles, rid, created, model, chat, include_usage, seed_scope,
                                         tok if want_lp else None, names if tool_calls else None, predicted, ech),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache", **where})
    results = await collect_all(handles, raw)
    if results is None:
        return Response(status_code=499)
    choices = []
    for index, (text, final, lps, prompt_lps) in enumerate(results):
        logprobs = None
        if want_lp:
            logprobs = {"content": logprobs_content(tok, lps)} if chat else \
                ech.logprobs(tok, prompt_lps, lps) if ech is not None else completion_logprobs(tok, lps)[0]
        finish = final.finish_reason
        if ech is not None:
            text, finish = (ech.text, "length") if ech.scored_only else (ech.text + text, finish)
        message = {"role": "assistant", "content": text}
        if tool_calls:
            content, calls = parse_tool_calls(text, names)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                finish = "tool_calls" if finish == "stop" else finish
        choices.append({"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs} if chat
                       else {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs})
    stats = [final.stats for _, final, _, _ in results]
    return JSONResponse({"id": rid, "object": obj, "created": created, "model": model, "choices": choices,
                         "usage": usage_of(stats, predicted, ech is not None and ech.scored_only),
                         "speculative": speculative_stats(stats[0], seed_scope)}, headers=where)


def usage_of(stats: list, predicted: bool = False, scored_only: bool = False) -> dict:
    """The usage of a request's choices: the prompt counted once (OpenAI's), the completions summed (none when
    the prompt was only scored: echo with max_tokens 0), and as cached_tokens the most any choice reused (n > 1:
    the choices after the first copy its prefill)."""
    out = usage(stats[0], predicted)
    if len(stats) > 1 or scored_only:
        done = 0 if scored_only else sum(s.completion_tokens for s in stats)
        out.update(completion_tokens=done, total_tokens=out["prompt_tokens"] + done)
        out["prompt_tokens_details"]["cached_tokens"] = max(s.cached_tokens for s in stats)
        if predicted:
            out["completion_tokens_details"] = {k: sum(usage(s, True)["completion_tokens_details"][k] for s in stats)
                                                for k in out["completion_tokens_details"]}
    return out


async def collect_all(handles: list[RequestStream], raw: Request) -> list | None:
    """Every choice's (text, final delta, logprobs, prompt logprobs), or None when the client went away (its
    requests aborted). An engine error is that request's 500; a drain's cut a 503."""
    task = asyncio.ensure_future(asyncio.gather(*(collect(h) for h in handles)))
    try:
        while True:                                # a client that goes away aborts its request
            done, _ = await asyncio.wait({task}, timeout=0.2)
            if done:
                return task.result()
            if await raw.is_disconnected():
                task.cancel()
                return None
    except RequestAborted:
        raise APIError(503, CUT_MESSAGE, "server_error", code="server_shutting_down") from None
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - engine error for this request only
        raise APIError(500, f"generation failed: {type(exc).__name__}: {exc}", "internal_error") from None
    finally:
        for h in handles:
            h.abort()                              # no-op when finished


async def collect(handle: RequestStream):
    parts, final, lps, prompt_lps = [], None, [], None
    async for d in handle.deltas():
        parts.append(d.text)
        lps += d.logprobs or []
        prompt_lps = prompt_lps or d.prompt_logprobs
        final = d
    return "".join(parts), final, lps, prompt_lps


async def stream(handles: list[RequestStream], rid: str, created: int, model: str, chat: bool,
                  include_usage: bool, seed_scope: str | None = None, lp_tokenizer=None,
                  tool_names: set[str] | None = None, predicted: bool = False, echo: Echo | None = None):
    """The SSE stream of a request's choices, their chunks interleaved as they come (each names its index).
    lp_tokenizer: set when the request asked for logprobs: each chunk carries those of its tokens.
    tool_names: set when the output is parsed for tool calls (sent as delta.tool_calls)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    queue: asyncio.Queue = asyncio.Queue()
    finals: list = [None] * len(handles)

    async def pump(index: int, handle: RequestStream) -> None:
        try:
            async for event in _choice_chunks(handle, index, chat, lp_tokenizer,
                                              ToolStream(tool_names) if tool_names is not None else None, echo):
                if isinstance(event, dict):
                    await queue.put(event)
                else:
                    finals[index] = event
        except BaseException as exc:  # noqa: BLE001 - handed to the stream, which ends with an error event
            await queue.put(exc)
        finally:
            await queue.put(None)

    def wrap(choice: dict) -> dict:
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}

    tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
    try:
        if chat:
            for i in range(len(handles)):
                yield sse(wrap({"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                                "logprobs": None}))
        open_ = len(handles)
        while open_:
            event = await queue.get()
            if event is None:
                open_ -= 1
                continue
            if isinstance(event, BaseException):
                raise event
            chunk = wrap(event)
            if event.get("finish_reason") is not None:
                chunk["speculative"] = speculative_stats(finals[event["index"]], seed_scope)
            yield sse(chunk)
        if include_usage:
            yield sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                       "usage": usage_of(finals, predicted, echo is not None and echo.scored_only)})
        yield "data: [DONE]\n\n"
    except RequestAborted:
        yield sse(error_body(CUT_MESSAGE, "server_error", code="server_shutting_down"))
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - an error event, then [DONE]; never a silent truncation
        yield sse(error_body(f"generation failed: {type(exc).__name__}: {exc}", "internal_error"))
        yield "data: [DONE]\n\n"
    finally:
        for t in tasks:
            t.cancel()
        for h in handles:
            h.abort()                              # client gone mid-stream: stop decoding within one step


async def _choice_chunks(handle: RequestStream, index: int, chat: bool, lp_tokenizer, tools: ToolStream | None,
                         echo: Echo | None = None):
    """One choice's chunks (the `choices[0]` of each, with its index), its final stats (a RequestStats) just before
    its last chunk. echo: the prompt comes first, in one chunk (with its logprobs when asked)."""
    offset = 0
    echoed, prompt_lps = False, None

    def choice(text: str | None, finish_reason=None, lps=None) -> dict:
        nonlocal offset
        logprobs = None
        if lp_tokenizer is not None:
            if chat:
                logprobs = {"content": logprobs_content(lp_tokenizer, lps or [])}
            else:
                logprobs, offset = completion_logprobs(lp_tokenizer, lps or [], offset)
        if chat:
            return {"index": index, "delta": {"content": text} if text is not None else {},
                    "finish_reason": finish_reason, "logprobs": logprobs}
        return {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": logprobs}

    def calls_chunk(calls: list[dict]) -> dict:
        return {"index": index, "delta": {"tool_calls": calls}, "finish_reason": None, "logprobs": None}

    async for d in handle.deltas():
        text, reason = d.text, d.finish_reason
        if echo is not None:
            prompt_lps = prompt_lps or d.prompt_logprobs
            if echo.scored_only:                   # the prompt alone, once the engine's one token is done
                if d.finished:
                    yield d.stats
                    yield {"index": index, "text": echo.text, "finish_reason": "length",
                           "logprobs": None if lp_tokenizer is None else echo.logprobs(lp_tokenizer, prompt_lps, [])}
                continue
            if not echoed:
                echoed = True
                first = {"index": index, "text": echo.text, "finish_reason": None, "logprobs": None}
                offset = len(echo.text)
                if lp_tokenizer is not None:
                    first["logprobs"] = lps = echo.logprobs(lp_tokenizer, prompt_lps or [], [])
                    offset = lps["text_offset"][-1] + len(lps["tokens"][-1])
                yield first
        if tools is not None:
            text, calls = tools.feed(d.text)
            if calls:
                yield calls_chunk(calls)
            if d.finished:
                rest, calls = tools.finish()
                text += rest
                if calls:
                    yield calls_chunk(calls)
                reason = "tool_calls" if tools.num_calls and reason == "stop" else reason
        if d.finished:
            yield d.stats                          # before its last chunk: the stream adds it there
            yield choice(text or None, reason, lps=d.logprobs)
        elif text or (lp_tokenizer is not None and d.logprobs):
            yield choice(text, lps=d.logprobs)
