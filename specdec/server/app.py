"""The FastAPI app: OpenAI routes, errors in OpenAI's shape, SSE streaming, auth, metrics, health."""
from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import SpeculativeConfig
from ..policy.pools import rollout_arm
from .async_engine import AsyncEngine, RequestAborted, RequestHandle
from .protocol import (APIError, ChatCompletionRequest, CompletionRequest, error_body, new_id, now,
                       speculative_stats, usage)

log = logging.getLogger("specdec.server")
RETRY_AFTER_S = 1


@dataclass
class ServerState:
    llm: object                      # specdec.LLM
    engine: AsyncEngine
    served_model_name: str
    api_key: str | None = None
    drain_timeout_s: float = 30.0
    traffic_fraction: float = 1.0        # share of requests (by request id hash) that may speculate

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        if state.engine.default_spec.method == "auto":
            # measure (or read) the cost model before serving, and export every pool's state
            await asyncio.to_thread(state.llm.policy)
            state.llm.policy().set_listener(state.engine.metrics.set_pool_enabled)
        state.engine.start()
        yield
        await asyncio.to_thread(state.engine.shutdown, state.drain_timeout_s)

    app = FastAPI(title="specdec", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible server with speculative decoding")
    app.state.specdec = state

    @app.exception_handler(APIError)
    async def _api_error(_, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg = "the request body is not valid JSON"
        return JSONResponse(error_body(f"{'.'.join(loc) + ': ' if loc else ''}{msg}", param=".".join(loc) or None),
                            status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_, exc: Exception):
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "internal_error"), status_code=500)

    if state.api_key:
        app.add_middleware(BearerAuth, api_key=state.api_key)

    @app.get("/health")
    async def health():
        if state.engine.alive:
            return {"status": "ok", "running": state.engine.num_running, "waiting": state.engine.num_waiting}
        return JSONResponse({"status": "unhealthy", "error": state.engine.last_error}, status_code=503)

    @app.get("/metrics")
    async def metrics():
        return Response(state.engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/speculative/status")
    async def speculative_status():
        spec = state.engine.default_spec
        return {"default": {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens},
                "traffic_fraction": state.traffic_fraction, "policy": state.llm.policy_status()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.served_model_name, "object": "model", "created": now(),
                                            "owned_by": "specdec", "max_model_len": state.max_model_len}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request):
        _check_model(state, req.model)
        msgs = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
        handle = _admit_and_submit(state, req, lambda: state.llm.tokenizer.encode_chat(msgs), raw, "chat")
        return await _respond(state, req, handle, raw, chat=True)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request):
        _check_model(state, req.model)
        if req.echo:
            raise APIError(400, "echo is not supported", param="echo")
        handle = _admit_and_submit(state, req, lambda: _completion_ids(state, req.prompt), raw, "completions")
        return await _respond(state, req, handle, raw, chat=False)

    return app


class BearerAuth:
    """Pure ASGI middleware (BaseHTTPMiddleware would hide client disconnects from the routes): /v1/* needs the key."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            auth = dict(scope.get("headers") or []).get(b"authorization")
            if auth != self.expected:
                resp = JSONResponse(error_body("invalid or missing API key", "authentication_error",
                                               code="invalid_api_key"), status_code=401)
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.served_model_name:
        raise APIError(404, f"The model '{model}' does not exist (served: '{state.served_model_name}')",
                       "not_found_error", param="model", code="model_not_found")


def _completion_ids(state: ServerState, prompt) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        return state.llm.tokenizer.encode(prompt)
    vocab = state.llm.tokenizer.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
    return list(prompt)


def _spec_for(state: ServerState, req) -> SpeculativeConfig:
    base = state.engine.default_spec
    o = req.speculative
    if o is None or (o.method is None and o.num_speculative_tokens is None):
        return base
    method = o.method or base.method
    if method == "auto" and o.num_speculative_tokens is not None:
        raise APIError(400, "with method 'auto' the policy chooses k; leave num_speculative_tokens out",
                       param="speculative.num_speculative_tokens")
    if method == "draft" and state.llm.draft is None:
        raise APIError(400, "speculative method 'draft' needs a draft model; this server was started without one",
                       param="speculative.method")
    k = o.num_speculative_tokens if o.num_speculative_tokens is not None else (
        base.num_speculative_tokens if method == base.method else None)
    try:
        return replace(base, method=method, num_speculative_tokens=k)
    except ValueError as exc:
        raise APIError(400, str(exc), param="speculative") from None


def _admit_and_submit(state: ServerState, req, encode, raw: Request, route: str) -> RequestHandle:
    engine = state.engine
    if not engine.try_admit():                     # before tokenizing: a full queue costs nothing
        engine.metrics.rejected.inc()
        raise APIError(429, f"the server is busy: {engine.max_queued} requests are already queued; retry later",
                       "rate_limit_error", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
    try:
        prompt_ids = encode()
        max_len = state.max_model_len
        n = len(prompt_ids)
        want = req.requested_max_tokens()
        if n >= max_len:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, your prompt is "
                                f"{n} tokens, which leaves no room for a completion.", param="messages",
                           code="context_length_exceeded")
        if want is not None and n + want > max_len:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                                f"{n + want} tokens ({n} in the prompt, {want} for the completion). Please reduce the "
                                "prompt or max_tokens.", param="max_tokens", code="context_length_exceeded")
        try:
            params = req.sampling_params(want if want is not None else max_len - n)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        spec = _spec_for(state, req)
        request_id = raw.headers.get("x-request-id") or new_id("req")
        arm = "spec"
        if state.traffic_fraction < 1.0 and rollout_arm(request_id, state.traffic_fraction) == "plain":
            spec, arm = replace(spec, method="none", num_speculative_tokens=None), "plain"
        return engine.submit(request_id, prompt_ids, params, spec, pool=req.spec_pool or route, arm=arm)
    except BaseException:
        engine.release_admission()
        raise


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _respond(state: ServerState, req, handle: RequestHandle, raw: Request, chat: bool):
    rid = new_id("chatcmpl" if chat else "cmpl")
    created, model = now(), state.served_model_name
    obj = "chat.completion" if chat else "text_completion"
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(handle, rid, created, model, chat, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    task = asyncio.ensure_future(_collect(handle))
    try:
        while True:                                # a client that goes away aborts its request
            done, _ = await asyncio.wait({task}, timeout=0.2)
            if done:
                break
            if await raw.is_disconnected():
                handle.abort()
                task.cancel()
                return Response(status_code=499)
        text, final = task.result()
    except RequestAborted:
        raise APIError(503, "the request was aborted (server shutting down)", "server_error") from None
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - engine error for this request only
        raise APIError(500, f"generation failed: {type(exc).__name__}: {exc}", "internal_error") from None
    finally:
        handle.abort()                             # no-op when finished
    stats = final.stats
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": final.finish_reason,
               "logprobs": None} if chat else
              {"index": 0, "text": text, "finish_reason": final.finish_reason, "logprobs": None})
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage(stats.prompt_tokens, stats.completion_tokens), "speculative": speculative_stats(stats)}


async def _collect(handle: RequestHandle):
    parts, final = [], None
    async for d in handle.deltas():
        parts.append(d.text)
        final = d
    return "".join(parts), final


async def _stream(handle: RequestHandle, rid: str, created: int, model: str, chat: bool, include_usage: bool):
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish_reason=None, role=False) -> dict:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}

    try:
        if chat:
            yield _sse(chunk(None, role=True))
        async for d in handle.deltas():
            if d.finished:
                last = chunk(d.text or None, d.finish_reason)
                last["speculative"] = speculative_stats(d.stats)
                yield _sse(last)
                if include_usage:
                    yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                                "usage": usage(d.stats.prompt_tokens, d.stats.completion_tokens)})
            elif d.text:
                yield _sse(chunk(d.text))
        yield "data: [DONE]\n\n"
    except RequestAborted:
        yield _sse(error_body("the request was aborted (server shutting down)", "server_error"))
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - an error event, then [DONE]; never a silent truncation
        yield _sse(error_body(f"generation failed: {type(exc).__name__}: {exc}", "internal_error"))
        yield "data: [DONE]\n\n"
    finally:
        handle.abort()                             # client gone mid-stream: stop decoding within one step
