"""The FastAPI app: OpenAI routes, errors in OpenAI's shape, SSE streaming, auth, metrics, health, drain."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import PLAIN, SpeculativeConfig, get_method
from ..errors import SpecDecError
from ..policy.pools import rollout_arm
from ..sampling.grammar import check_grammar
from .async_engine import QueueFull, RequestAborted
from .engine_client import EngineClient, RequestStream
from .middleware import BearerAuth, HeaderGuard, RequestGuard
from .protocol import (
    ROLES,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    completion_logprobs,
    error_body,
    logprobs_content,
    new_id,
    now,
    prefix_affinity,
    seed_scope,
    shown,
    speculative_stats,
    usage,
)
from .tools import ToolStream, parse_tool_calls, template_messages

log = logging.getLogger("specdec.server")
RETRY_AFTER_S = 1
# 2 MiB: a prompt that fills a 32k-token window is ~0.3 MB even as JSON-escaped CJK text or a list of token ids,
# so this leaves ~7x headroom, while a larger body cannot be a prompt that fits and only costs parse time.
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024
DEFAULT_MAX_SPEC_POOLS = 32
OTHER_POOL = "other"          # where spec_pool tags beyond --max-spec-pools go


@dataclass
class ServerState:
    engine: EngineClient             # an AsyncEngine, or a RayEngineClient in front of N engine replicas
    served_model_name: str | None        # None: the engine's model name (known once it has started)
    api_key: str | None = None
    drain_timeout_s: float = 30.0
    traffic_fraction: float = 1.0        # share of requests (by request id hash) that may speculate
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_spec_pools: int = DEFAULT_MAX_SPEC_POOLS   # distinct client spec_pool tags; later new ones share OTHER_POOL
    draining: bool = field(default=False, init=False)   # SIGTERM seen: no new requests
    closed: bool = field(default=False, init=False)     # drain deadline passed: the engine is shut down
    pools: set = field(default_factory=set, init=False)
    _drain_task: asyncio.Future | None = field(default=None, init=False)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        await state.engine.startup()
        state.served_model_name = state.served_model_name or state.engine.model_name
        yield
        await drain(state)

    app = FastAPI(title="specdec", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible server with speculative decoding")
    app.state.specdec = state

    @app.exception_handler(APIError)
    async def _api_error(_, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_, exc: RequestValidationError):
        return JSONResponse(_validation_body(exc.errors()), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_, exc: Exception):
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "internal_error"), status_code=500)

    app.add_middleware(RequestGuard, max_bytes=lambda: state.max_request_bytes)
    if state.api_key:
        app.add_middleware(BearerAuth, api_key=state.api_key)      # 401 before reading any body
    app.add_middleware(HeaderGuard)                                # outermost: 431 before anything reads them

    @app.get("/health")
    async def health():
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if state.engine.alive:
            return {"status": "ok", "running": state.engine.num_running, "waiting": state.engine.num_waiting}
        return JSONResponse({"status": "unhealthy", "error": state.engine.last_error}, status_code=503)

    @app.get("/metrics")
    async def metrics():
        return Response(state.engine.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/speculative/status")
    async def speculative_status():
        spec = state.engine.default_spec
        return {"default": {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens},
                "methods": state.engine.methods(), "traffic_fraction": state.traffic_fraction,
                "policy": state.engine.policy_status(), "prefix_cache": state.engine.prefix_cache_status()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.served_model_name, "object": "model", "created": now(),
                                            "owned_by": "specdec", "max_model_len": state.max_model_len}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request):
        req.check_supported()
        _check_model(state, req.model)
        msgs = template_messages(req.messages)
        mode = req.tool_mode
        tools = mode.tools if mode is not None else None
        tok = state.engine.tokenizer

        def encode() -> list[int]:
            try:
                text = tok.apply_chat_template(msgs, tools=tools)
                _check_lower_bound(state, req, tok.min_tokens(text), "messages")
                return tok.encode_chat(msgs, rendered=text, tools=tools)
            except SpecDecError as exc:        # the template refuses these messages (e.g. role order)
                raise APIError(400, str(exc), param="messages") from None

        handle, scope = await _admit_and_submit(state, req, encode, raw, "chat", "messages")
        return await _respond(state, req, handle, raw, chat=True, seed_scope=scope)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request):
        req.check_supported()
        _check_model(state, req.model)
        handle, scope = await _admit_and_submit(state, req, lambda: _completion_ids(state, req), raw,
                                                "completions", "prompt")
        return await _respond(state, req, handle, raw, chat=False, seed_scope=scope)

    return app


async def drain(state: ServerState) -> None:
    """SIGTERM: stop admitting; let running and queued requests finish for up to `drain_timeout_s`; then cut the
    rest, each ending with an error (a stream: an error event, then [DONE]), and say how many in one WARNING.
    Idempotent: `specdec serve` starts it as soon as the signal arrives, the app's shutdown awaits the same one."""
    if state._drain_task is None:
        state._drain_task = asyncio.ensure_future(_drain(state))
    await asyncio.shield(state._drain_task)


async def _drain(state: ServerState) -> None:
    engine = state.engine
    state.draining = True
    deadline = time.monotonic() + state.drain_timeout_s
    while (engine.num_running or engine.num_waiting) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    cut = engine.num_running + engine.num_waiting
    state.closed = True           # requests still tokenizing get 503 instead of joining a stopped engine
    if cut:
        log.warning("drain timeout (%gs) reached: cut %d unfinished request(s); each ended with an error "
                    "(streams: an error event, then [DONE])", state.drain_timeout_s, cut)
    await asyncio.to_thread(engine.shutdown, 0)     # aborts what is left; each handle gets RequestAborted


_TYPE_TAG = re.compile(r"^(str|int|float|bool|none)$|[\[\](-]")   # a union member's tag in a pydantic loc


def _validation_body(errs: list[dict]) -> dict:
    """pydantic's errors -> one OpenAI error. A union reports one error per member; the informative one is the
    first that is not a plain type mismatch, else the deepest mismatch. Union-member tags are dropped from the
    location."""
    if not errs:
        return error_body("invalid request")
    first = next((e for e in errs if not str(e.get("type", "")).endswith("_type")), None) or \
        max(errs, key=lambda e: len(e.get("loc", ())))
    kind = first.get("type")
    if kind == "json_invalid":
        err = (first.get("ctx") or {}).get("error")
        return error_body(f"the request body is not valid JSON{f' ({err})' if err else ''}")
    raw = first.get("loc", ())
    # a message's role selects its schema (protocol.ChatMessage): pydantic puts the role in the location
    loc = [str(x) for i, x in enumerate(raw) if x != "body" and not (isinstance(x, str) and _TYPE_TAG.search(x))
           and not (x in ROLES and i >= 2 and raw[i - 2] == "messages")]
    if not loc and kind in ("model_attributes_type", "dict_type", "missing"):
        return error_body("the request body must be a JSON object")
    msg = first.get("msg", "invalid value")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("role")
        msg = f"role must be one of {', '.join(ROLES)}"
    param = ".".join(loc) or None
    return error_body(f"{param + ': ' if param else ''}{msg}", param=param)


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.served_model_name:
        raise APIError(404, f"The model '{shown(model)}' does not exist (served: '{state.served_model_name}')",
                       "not_found_error", param="model", code="model_not_found")


def _context_error(max_len: int, n: int, want: int | None, prompt_param: str, at_least: bool = False) -> APIError:
    size = f"at least {n} tokens" if at_least else f"{n} tokens"
    if want is None or n >= max_len:
        return APIError(400, f"This model's maximum context length is {max_len} tokens. However, your prompt is "
                             f"{size}, which leaves no room for a completion.", param=prompt_param,
                        code="context_length_exceeded")
    return APIError(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                         f"{'at least ' if at_least else ''}{n + want} tokens ({size} in the prompt, {want} for the "
                         "completion). Please reduce the prompt or max_tokens.", param="max_tokens",
                    code="context_length_exceeded")


def _check_lower_bound(state: ServerState, req, lower: int | None, prompt_param: str) -> None:
    """Before tokenizing: refuse a text that certainly does not fit (`lower` <= its token count)."""
    if lower is None:
        return
    max_len, want = state.max_model_len, req.requested_max_tokens()
    if lower >= max_len or (want is not None and lower + want > max_len):
        raise _context_error(max_len, lower, want, prompt_param, at_least=True)


def _completion_ids(state: ServerState, req: CompletionRequest) -> list[int]:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        _check_lower_bound(state, req, state.engine.tokenizer.min_tokens(prompt), "prompt")
        return state.engine.tokenizer.encode(prompt)
    vocab = state.engine.tokenizer.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
    return list(prompt)


def _spec_for(state: ServerState, req) -> SpeculativeConfig:
    base = state.engine.default_spec
    o = req.speculative
    if o is None or (o.method is None and o.num_speculative_tokens is None and o.eagle_topk is None
                     and o.num_steps is None):
        return base
    method = o.method or base.method
    declared = get_method(method)                 # the schema let only declared methods through
    if declared.kind == "policy" and o.num_speculative_tokens is not None:
        raise APIError(400, f"with method '{method}' the policy chooses k; leave num_speculative_tokens out",
                       param="speculative.num_speculative_tokens")
    runs = [m["method"] for m in state.engine.methods()]
    if method not in runs:
        start = {"draft_model": " (--draft, or a draft-model --speculative-config)",
                 "head": " (--speculative-config method or --spec-heads)"}.get(declared.needs, "")
        raise APIError(400, f"speculative method '{method}' needs {declared.needs_text}{start}; this server runs: "
                            f"{', '.join(runs)}", param="speculative.method")
    same = method == base.method
    k = o.num_speculative_tokens if o.num_speculative_tokens is not None else (
        base.num_speculative_tokens if same else None)
    topk = o.eagle_topk or (base.eagle_topk if same else 1)
    steps = o.num_steps or (base.num_steps if same and k == base.num_speculative_tokens and topk == base.eagle_topk
                            else None)
    try:
        return replace(base, method=method, num_speculative_tokens=k, eagle_topk=topk, num_steps=steps)
    except ValueError as exc:
        raise APIError(400, str(exc), param="speculative") from None


def _pool_for(state: ServerState, tag: str | None, route: str) -> str:
    """The request's acceptance pool: its spec_pool tag (the first --max-spec-pools distinct tags; later new ones
    share OTHER_POOL, so clients cannot grow the pools and the metric labels without bound), else its route."""
    if tag is None:
        return route
    if tag in state.pools:
        return tag
    if len(state.pools) < state.max_spec_pools:
        state.pools.add(tag)
        return tag
    if OTHER_POOL not in state.pools:
        state.pools.add(OTHER_POOL)
        log.warning("%d distinct spec_pool tags seen (--max-spec-pools): new tags now share the pool '%s'",
                    state.max_spec_pools, OTHER_POOL)
    return OTHER_POOL


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry on another replica", "server_error",
                    code="server_shutting_down")


def _queue_full(engine) -> APIError:
    engine.observe_rejected()
    return APIError(429, f"the server is busy: {engine.max_queued} requests are already queued; retry later",
                    "rate_limit_error", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})


async def _admit_and_submit(state: ServerState, req, encode, raw: Request, route: str,
                            prompt_param: str) -> tuple[RequestStream, str | None]:
    """Admit (or 429), tokenize in a worker thread (the event loop keeps serving), check the context window,
    submit. Returns the handle and the response's `seed_scope`."""
    engine = state.engine
    if state.draining:
        raise _shutting_down()
    if not engine.try_admit():                     # before tokenizing: a full queue costs nothing
        raise _queue_full(engine)
    try:
        prompt_ids = await asyncio.to_thread(encode)
        max_len = state.max_model_len
        n = len(prompt_ids)
        want = req.requested_max_tokens()
        if n >= max_len or (want is not None and n + want > max_len):
            raise _context_error(max_len, n, want, prompt_param)
        try:
            params = req.sampling_params(want if want is not None else max_len - n)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        if params.structured_outputs is not None:     # a bad schema or grammar is the client's error, said now
            try:
                await asyncio.to_thread(check_grammar, params.structured_outputs, state.engine.tokenizer)
            except SpecDecError as exc:
                param = "structured_outputs" if req.structured_outputs is not None else "response_format"
                raise APIError(400, str(exc), param=param) from None
        spec = _spec_for(state, req)
        # the engine's key is always ours: a client's X-Request-Id (echoed in the response, as vLLM does) may repeat
        request_id = new_id("req")
        arm = "spec"
        client_id = raw.headers.get("x-request-id") or request_id
        if state.traffic_fraction < 1.0 and rollout_arm(client_id, state.traffic_fraction) == "plain":
            spec, arm = replace(spec, method=PLAIN, num_speculative_tokens=None), "plain"
        if state.closed:                           # drained while this request was tokenizing
            raise _shutting_down()
        try:
            handle = await engine.submit(request_id, prompt_ids, params, spec,
                                         pool=_pool_for(state, req.spec_pool, route), arm=arm,
                                         affinity=req.spec_pool or prefix_affinity(prompt_ids))
        except QueueFull:                          # N replicas: every replica and the router's queue are full
            raise _queue_full(engine) from None
    except BaseException:
        engine.release_admission()
        raise
    return handle, seed_scope(params, spec.method)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


CUT_MESSAGE = "the server shut down before this request finished (--drain-timeout reached)"


async def _respond(state: ServerState, req, handle: RequestStream, raw: Request, chat: bool,
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
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(handle, rid, created, model, chat, include_usage, seed_scope,
                                         tok if want_lp else None,
                                         ToolStream(names) if tool_calls else None),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache", **where})
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
                         "usage": usage(stats.prompt_tokens, stats.completion_tokens, stats.cached_tokens),
                         "speculative": speculative_stats(stats, seed_scope)}, headers=where)


async def _collect(handle: RequestStream):
    parts, final, lps = [], None, []
    async for d in handle.deltas():
        parts.append(d.text)
        lps += d.logprobs or []
        final = d
    return "".join(parts), final, lps


async def _stream(handle: RequestStream, rid: str, created: int, model: str, chat: bool, include_usage: bool,
                  seed_scope: str | None = None, lp_tokenizer=None, tools: ToolStream | None = None):
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
            yield _sse(chunk(None, role=True))
        async for d in handle.deltas():
            text, reason = d.text, d.finish_reason
            if tools is not None:
                text, calls = tools.feed(d.text)
                if calls:
                    yield _sse(calls_chunk(calls))
                if d.finished:
                    rest, calls = tools.finish()
                    text += rest
                    if calls:
                        yield _sse(calls_chunk(calls))
                    reason = "tool_calls" if tools.num_calls and reason == "stop" else reason
            if d.finished:
                last = chunk(text or None, reason, lps=d.logprobs)
                last["speculative"] = speculative_stats(d.stats, seed_scope)
                yield _sse(last)
                if include_usage:
                    yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                                "usage": usage(d.stats.prompt_tokens, d.stats.completion_tokens,
                                              d.stats.cached_tokens)})
            elif text or (lp_tokenizer is not None and d.logprobs):
                yield _sse(chunk(text, lps=d.logprobs))
        yield "data: [DONE]\n\n"
    except RequestAborted:
        yield _sse(error_body(CUT_MESSAGE, "server_error", code="server_shutting_down"))
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - an error event, then [DONE]; never a silent truncation
        yield _sse(error_body(f"generation failed: {type(exc).__name__}: {exc}", "internal_error"))
        yield "data: [DONE]\n\n"
    finally:
        handle.abort()                             # client gone mid-stream: stop decoding within one step
