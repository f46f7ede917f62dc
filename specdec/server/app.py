"""The FastAPI app: OpenAI routes, errors in OpenAI's shape, auth, metrics, health, status, drain. A request's way in
is admission.py, its way out (JSON or SSE) responses.py (the Responses API's: responses_api.py); the state they
share, state.py."""
from __future__ import annotations

import asyncio
import logging
import re
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import SpecDecError
from .admission import admit_and_submit, check_lower_bound, check_model, completion_ids
from .api_errors import APIError, error_body, shown
from .dashboard import KEEP, LiveSeries, page, read_sample, totals
from .messages import ROLES
from .metrics import vllm_alias
from .middleware import TENANT, BearerAuth, HeaderGuard, RequestGuard
from .protocol import ChatCompletionRequest, CompletionRequest
from .response_fields import now
from .responses import respond
from .responses_api import (
    ResponseStore,
    Turn,
    chat_request,
    conversation_of,
    not_found,
    respond_turn,
)
from .responses_protocol import ITEM_TYPES, ResponsesRequest
from .state import ServerState
from .tokenize_protocol import DetokenizeRequest, TokenizeChat, TokenizePrompt, TokenizeRequest
from .tools import template_messages

__all__ = ["ServerState", "create_app", "drain"]

log = logging.getLogger("specdec.server")


def create_app(state: ServerState) -> FastAPI:
    live = LiveSeries(state.engine.render_metrics) if state.dashboard else None

    @asynccontextmanager
    async def lifespan(app):
        await state.engine.startup()
        state.served_model_name = state.served_model_name or state.engine.model_name
        if live is not None:
            live.start()
        yield
        if live is not None:
            live.stop()
        await drain(state)

    app = FastAPI(title="specdec", version="0.1.0", lifespan=lifespan,
                  description="OpenAI-compatible server with speculative decoding")
    app.state.specdec = state
    response_store = ResponseStore()              # past responses, for previous_response_id

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
    if state.api_keys:
        app.add_middleware(BearerAuth, keys=state.api_keys)        # 401 before reading any body
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
        text = state.engine.render_metrics()
        if state.vllm_metrics:                     # the same families again under vLLM's names and labels
            text += vllm_alias(text)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/speculative/status")
    async def speculative_status():
        spec = state.engine.default_spec
        counted = totals(read_sample(state.engine.render_metrics().decode()))      # /metrics' counters, summed
        return {"default": {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
                            "draft_p_min": spec.draft_p_min},
                "methods": state.engine.methods(), "traffic_fraction": state.traffic_fraction,
                "policy": state.engine.policy_status(), "prefix_cache": state.engine.prefix_cache_status(),
                "speculation": counted}

    if live is not None:
        @app.get("/dashboard", response_class=HTMLResponse)
        async def dashboard():
            return HTMLResponse(page())

        @app.get("/v1/dashboard/data")
        async def dashboard_data(raw: Request):
            args = dict(raw.query_params)
            unknown = sorted(set(args) - {"seconds", "step"})
            if unknown:
                raise APIError(400, f"unknown query parameter '{unknown[0]}' (seconds, step)", param=unknown[0])
            seconds = _int_param(args, "seconds", 300, 1, int(KEEP * live.every_s))
            step = _int_param(args, "step", 2, 1, 60)
            return live.window(seconds, step)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.served_model_name, "object": "model", "created": now(),
                                            "owned_by": "specdec", "max_model_len": state.max_model_len}]}

    def chat_encoder(req: ChatCompletionRequest, param: str = "messages"):
        """The prompt ids of a chat request (its tools in the template), computed in a worker thread."""
        msgs = template_messages(req.messages)
        mode = req.tool_mode
        tools = mode.tools if mode is not None else None
        tok = state.engine.tokenizer

        def encode() -> list[int]:
            try:
                text = tok.apply_chat_template(msgs, tools=tools)
                check_lower_bound(state, req, tok.min_tokens(text), param)
                return tok.encode_chat(msgs, rendered=text, tools=tools)
            except SpecDecError as exc:        # the template refuses these messages (e.g. role order)
                raise APIError(400, str(exc), param=param) from None
        return encode

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request):
        req.check_supported()
        check_model(state, req.model)
        sub = await admit_and_submit(state, req, chat_encoder(req), raw, "chat", "messages")
        return await respond(state, req, sub, raw, chat=True)

    @app.post("/v1/responses")
    async def responses_create(req: ResponsesRequest, raw: Request):
        """OpenAI's Responses API, as the chat completion it means (responses_api.py)."""
        check_model(state, req.model)
        tenant = raw.scope.get(TENANT, "")
        previous: list[dict] = []
        if req.previous_response_id is not None:
            found = response_store.get(tenant, req.previous_response_id)
            if found is None:
                raise not_found(req.previous_response_id)
            previous = found[1]
        conversation = conversation_of(req, previous)
        chat = chat_request(req, conversation)
        turn = Turn(req, state.served_model_name, conversation)
        sub = await admit_and_submit(state, chat, chat_encoder(chat, "input"), raw, "responses", "input")
        return await respond_turn(state, response_store, tenant, turn, chat, sub, raw)

    @app.get("/v1/responses/{response_id}")
    async def responses_get(response_id: str, raw: Request):
        found = response_store.get(raw.scope.get(TENANT, ""), response_id)
        if found is None:
            raise APIError(404, f"Response with id '{shown(response_id)}' not found.", "invalid_request_error",
                           param="response_id", code="response_not_found")
        return found[0]

    @app.delete("/v1/responses/{response_id}")
    async def responses_delete(response_id: str, raw: Request):
        if not response_store.delete(raw.scope.get(TENANT, ""), response_id):
            raise APIError(404, f"Response with id '{shown(response_id)}' not found.", "invalid_request_error",
                           param="response_id", code="response_not_found")
        return {"id": response_id, "object": "response", "deleted": True}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request):
        req.check_supported()
        check_model(state, req.model)
        sub = await admit_and_submit(state, req, lambda: completion_ids(state, req), raw, "completions", "prompt")
        return await respond(state, req, sub, raw, chat=False, echo=req.echo)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        """vLLM's /tokenize (`count`, `max_model_len`, `tokens`, `token_strs`) and llama-server's (`content`,
        `with_pieces`)."""
        check_model(state, req.model)
        tok = state.engine.tokenizer
        try:
            if isinstance(req, TokenizeChat):
                tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
                ids = await asyncio.to_thread(tok.encode_chat, template_messages(req.messages), None, tools,
                                              req.add_generation_prompt)
            else:
                text = req.prompt if isinstance(req, TokenizePrompt) else req.content
                ids = await asyncio.to_thread(tok.encode, text, req.add_special_tokens and req.add_special)
        except SpecDecError as exc:            # the template refuses these messages (e.g. role order)
            raise APIError(400, str(exc), param="messages") from None
        out = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
        if req.return_token_strs:
            out["token_strs"] = [tok.id_to_token(i) for i in ids]
        if req.with_pieces:                    # llama-server's shape: each token with its text
            out["tokens"] = [{"id": i, "piece": tok.decode([i], skip_special_tokens=False)} for i in ids]
        return out

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        """vLLM's /detokenize (`prompt`) and llama-server's (`content`): the same text under both names."""
        check_model(state, req.model)
        tok = state.engine.tokenizer
        bad = next((t for t in req.tokens if not 0 <= t < tok.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token {bad} is not in [0, {tok.vocab_size})", param="tokens")
        text = tok.decode(req.tokens, skip_special_tokens=False)
        return {"prompt": text, "content": text}

    return app


async def drain(state: ServerState) -> None:
    """SIGTERM: stop admitting; let running and queued requests finish for up to `drain_timeout_s`; then cut the
    rest, each ending with an error (a stream: an error event, then [DONE]), and say how many in one WARNING.
    Idempotent: `specdec serve` starts it as soon as the signal arrives, the app's shutdown awaits the same one."""
    if state.drain_task is None:
        state.drain_task = asyncio.ensure_future(_drain(state))
    await asyncio.shield(state.drain_task)


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
_MODEL_TAG = re.compile(r"^[A-Z][A-Za-z0-9]*$")      # a body that is a union of models: the member's class name


def _int_param(args: dict, name: str, default: int, lo: int, hi: int) -> int:
    text = args.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise APIError(400, f"{name} must be an integer, got '{text[:32]}'", param=name) from None
    if not lo <= value <= hi:
        raise APIError(400, f"{name} must be in [{lo}, {hi}], got {value}", param=name)
    return value


def _validation_body(errs: list[dict]) -> dict:
    """pydantic's errors -> one OpenAI error. A union reports one error per member; the informative one is the
    first that is not a plain type mismatch, else the deepest mismatch. Union-member tags are dropped from the
    location."""
    if not errs:
        return error_body("invalid request")
    members = [e for e in errs if len(e.get("loc", ())) > 1 and _MODEL_TAG.match(str(e["loc"][1]))]
    if members and len(members) == len(errs):
        # a body that fits none of a union's shapes (/tokenize): where each shape only misses its own key, name
        # them; else the error of the shape it came closest to (about a key the body has, the deepest)
        if all(e.get("type") == "missing" and len(e["loc"]) == 3 for e in errs):
            keys = list(dict.fromkeys(str(e["loc"][2]) for e in errs))
            return error_body(f"one of {', '.join(keys)} is required")
        errs = [max(errs, key=lambda e: (e.get("type") not in ("missing", "extra_forbidden"), len(e["loc"])))]
    first = next((e for e in errs if not str(e.get("type", "")).endswith("_type")), None) or \
        max(errs, key=lambda e: len(e.get("loc", ())))
    kind = first.get("type")
    if kind == "json_invalid":
        err = (first.get("ctx") or {}).get("error")
        return error_body(f"the request body is not valid JSON{f' ({err})' if err else ''}")
    raw = first.get("loc", ())
    # a message's role selects its schema (protocol.ChatMessage): pydantic puts the role in the location
    loc = [str(x) for i, x in enumerate(raw) if x != "body" and not (isinstance(x, str) and _TYPE_TAG.search(x))
           and not (x in ROLES and i >= 2 and raw[i - 2] == "messages") and not (i == 1 and members)
           and not (x in ITEM_TYPES and "input" in raw[max(0, i - 3):i - 1])]   # a Responses input item's type
    if not loc and kind in ("model_attributes_type", "dict_type", "missing"):
        return error_body("the request body must be a JSON object")
    msg = first.get("msg", "invalid value")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("role")
        msg = f"role must be one of {', '.join(ROLES)}"
    param = ".".join(loc) or None
    return error_body(f"{param + ': ' if param else ''}{msg}", param=param)
