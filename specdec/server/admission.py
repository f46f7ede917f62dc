"""A request's way in: model and context-window checks, its speculative config and pool, admission (or 429),
tokenizing off the event loop, and submission to the engine."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from fastapi import Request

from ..config import PLAIN, SpeculativeConfig
from ..errors import SpecDecError
from ..policy.pools import rollout_arm
from ..proposers.prediction import METHOD as PREDICTION
from ..proposers.registry import get_method
from ..sampling.grammar import check_grammar
from .api_errors import APIError, shown
from .async_engine import QueueFull
from .engine_client import RequestStream
from .middleware import TENANT
from .protocol import CompletionRequest
from .response_fields import new_id, prefix_affinity, seed_scope
from .state import OTHER_POOL, RETRY_AFTER_S, ServerState

log = logging.getLogger("specdec.server")


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.served_model_name:
        raise APIError(404, f"The model '{shown(model)}' does not exist (served: '{state.served_model_name}')",
                       "not_found_error", param="model", code="model_not_found")


def context_error(max_len: int, n: int, want: int | None, prompt_param: str, at_least: bool = False) -> APIError:
    size = f"at least {n} tokens" if at_least else f"{n} tokens"
    if want is None or n >= max_len:
        return APIError(400, f"This model's maximum context length is {max_len} tokens. However, your prompt is "
                             f"{size}, which leaves no room for a completion.", param=prompt_param,
                        code="context_length_exceeded")
    return APIError(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                         f"{'at least ' if at_least else ''}{n + want} tokens ({size} in the prompt, {want} for the "
                         "completion). Please reduce the prompt or max_tokens.", param="max_tokens",
                    code="context_length_exceeded")


def check_lower_bound(state: ServerState, req, lower: int | None, prompt_param: str) -> None:
    """Before tokenizing: refuse a text that certainly does not fit (`lower` <= its token count)."""
    if lower is None:
        return
    max_len, want = state.max_model_len, req.requested_max_tokens()
    if lower >= max_len or (want is not None and lower + want > max_len):
        raise context_error(max_len, lower, want, prompt_param, at_least=True)


def completion_ids(state: ServerState, req: CompletionRequest) -> list[int]:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, "only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        check_lower_bound(state, req, state.engine.tokenizer.min_tokens(prompt), "prompt")
        return state.engine.tokenizer.encode(prompt)
    vocab = state.engine.tokenizer.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
    return list(prompt)


def spec_for(state: ServerState, req, prediction: list[int] | None = None) -> SpeculativeConfig:
    """The request's speculative config: the server's, as its `speculative` field overrides it; a request with a
    `prediction` (its tokens given here) runs method predicted_outputs over them."""
    base = state.engine.default_spec
    o = req.speculative
    if prediction is not None:
        return prediction_spec(base, o, prediction)
    if o is None or (o.method is None and o.num_speculative_tokens is None and o.eagle_topk is None
                     and o.num_steps is None and o.draft_p_min is None):
        return base
    method = o.method or base.method
    declared = get_method(method)                 # the schema let only declared methods through
    if declared.kind == "policy" and o.num_speculative_tokens is not None:
        raise APIError(400, f"with method '{method}' the policy chooses k; leave num_speculative_tokens out",
                       param="speculative.num_speculative_tokens")
    runs = state.engine.method_names()          # per request: the names only, no proposer status collected
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
        return replace(base, method=method, num_speculative_tokens=k, eagle_topk=topk, num_steps=steps,
                       draft_p_min=base.draft_p_min if o.draft_p_min is None else o.draft_p_min)
    except ValueError as exc:
        raise APIError(400, str(exc), param="speculative") from None


def prediction_spec(base: SpeculativeConfig, o, prediction: list[int]) -> SpeculativeConfig:
    """OpenAI's Predicted Outputs: method predicted_outputs drafts the predicted tokens (k: the request's
    num_speculative_tokens, else the method's default); naming another method beside a prediction is a 400."""
    if o is not None and o.method not in (None, PREDICTION.name):
        raise APIError(400, f"a prediction is drafted by method '{PREDICTION.name}'; leave speculative.method out "
                            f"or set it to '{PREDICTION.name}' (got '{o.method}')", param="prediction")
    k = o.num_speculative_tokens if o is not None and o.num_speculative_tokens is not None else None
    try:
        return replace(base, method=PREDICTION.name, num_speculative_tokens=k, eagle_topk=1, num_steps=None,
                       prediction=prediction)
    except ValueError as exc:
        raise APIError(400, str(exc), param="speculative") from None


def pool_for(state: ServerState, tag: str | None, route: str) -> str:
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


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry on another replica", "server_error",
                    code="server_shutting_down")


def queue_full(engine) -> APIError:
    engine.observe_rejected()
    return APIError(429, f"the server is busy: {engine.max_queued} requests are already queued; retry later",
                    "rate_limit_error", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})


def cache_partition(tenant: str, cache_salt: str | None) -> str | None:
    """The engine's cache_salt for a request: its API key's tenant and its own salt together (None: neither, the
    shared partition). A salt never reaches another tenant's partition, whatever it is."""
    if not tenant and cache_salt is None:
        return None
    return f"{tenant}\0{cache_salt or ''}"


@dataclass
class Submitted:
    handles: list[RequestStream]          # one per choice (the request's `n`), choice i is handles[i]
    seed_scope: str | None                # what a seed reproduces (response_fields.seed_scope)
    prompt_ids: list[int]


async def admit_and_submit(state: ServerState, req, encode, raw: Request, route: str,
                            prompt_param: str) -> Submitted:
    """Admit (or 429), tokenize in a worker thread (the event loop keeps serving), check the context window,
    submit: one engine request per choice.

    n > 1: n engine requests of one prompt, submitted together; the scheduler lets the later ones wait for the
    first one's prefill and copy its K/V (one prefill). With a seed, choice i samples with seed + i (vLLM's rule),
    so the n choices differ and the whole response is reproducible."""
    engine = state.engine
    choices = req.n
    if state.draining:
        raise shutting_down()
    if not engine.try_admit():                     # before tokenizing: a full queue costs nothing
        raise queue_full(engine)
    engine.admit_more(choices - 1)                 # the request is admitted as a whole, its n choices with it
    handles: list[RequestStream] = []
    try:
        prompt_ids = await asyncio.to_thread(encode)
        max_len = state.max_model_len
        n = len(prompt_ids)
        want = req.requested_max_tokens()
        if n >= max_len or (want is not None and n + want > max_len):
            raise context_error(max_len, n, want, prompt_param)
        try:
            params = req.sampling_params(want if want is not None else max_len - n)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        vocab = state.engine.tokenizer.vocab_size
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise APIError(400, f"logit_bias: token id {max(params.logit_bias)} is not in the vocabulary (ids 0.."
                                f"{vocab - 1})", param="logit_bias")
        if params.structured_outputs is not None:     # a bad schema or grammar is the client's error, said now
            try:
                await asyncio.to_thread(check_grammar, params.structured_outputs, state.engine.tokenizer)
            except SpecDecError as exc:
                param = "structured_outputs" if req.structured_outputs is not None else "response_format"
                raise APIError(400, str(exc), param=param) from None
        pred = getattr(req, "prediction", None)
        pred_ids = None if pred is None else await asyncio.to_thread(state.engine.tokenizer.encode_text, pred.text)
        spec = spec_for(state, req, pred_ids)
        # the engine's key is always ours: a client's X-Request-Id (echoed in the response, as vLLM does) may repeat
        request_id = new_id("req")
        arm = "spec"
        client_id = raw.headers.get("x-request-id") or request_id
        if state.traffic_fraction < 1.0 and rollout_arm(client_id, state.traffic_fraction) == "plain":
            spec, arm = replace(spec, method=PLAIN, num_speculative_tokens=None), "plain"
        if state.closed:                           # drained while this request was tokenizing
            raise shutting_down()
        for i in range(choices):
            child = params if i == 0 or params.seed is None else replace(params, seed=params.seed + i)
            try:
                handles.append(await engine.submit(request_id if i == 0 else f"{request_id}-{i}", prompt_ids, child,
                                                   spec, pool=pool_for(state, req.spec_pool, route), arm=arm,
                                                   affinity=req.spec_pool or prefix_affinity(prompt_ids),
                                                   cache_salt=cache_partition(raw.scope.get(TENANT, ""),
                                                                              req.cache_salt)))
            except QueueFull:                      # N replicas: every replica and the router's queue are full
                raise queue_full(engine) from None
    except BaseException:
        for h in handles:
            h.abort()
        for _ in range(choices - len(handles)):
            engine.release_admission()
        raise
    return Submitted(handles, seed_scope(params, spec.method), prompt_ids)
