"""OpenAI request/response shapes (pydantic), plus specdec's extension fields.

Requests are validated here and mapped onto `SamplingParams`; anything invalid becomes an `APIError` with
OpenAI's error shape and a 4xx status. Unknown fields are ignored (as OpenAI clients send many).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..sampling_params import SamplingParams


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class SpeculativeOverride(BaseModel):
    """Per-request extension: `"speculative": {"method": "none"}` or `{"num_speculative_tokens": 2}`."""
    model_config = ConfigDict(extra="forbid")
    method: Literal["none", "ngram", "draft", "auto"] | None = None
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=32)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | int | None = None
    speculative: SpeculativeOverride | None = None
    spec_pool: str | None = Field(default=None, min_length=1, max_length=64)   # acceptance pool tag (method auto)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        if self.n != 1:
            raise APIError(400, "only n=1 is supported", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name} is not supported (only 0)", param=name)
        if self.logprobs:
            raise APIError(400, "logprobs are not supported", param="logprobs")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise APIError(400, "stop strings must be non-empty", param="stop")
        if len(stop) > 16:
            raise APIError(400, "at most 16 stop strings", param="stop")
        return SamplingParams(max_tokens=max_tokens, temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or -1,
                              min_p=self.min_p or 0.0, seed=self.seed, stop=stop, ignore_eos=self.ignore_eos)


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] = Field(min_length=1)
    echo: bool = False

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def speculative_stats(stats: Any) -> dict:
    """The per-request extension field: what speculation did for this request."""
    return {k: getattr(stats, k) for k in
            ("method", "num_speculative_tokens", "draft_steps", "lookup_steps", "draft_tokens", "accepted_tokens",
             "acceptance_rate", "mean_accepted_length", "accepted_per_position", "target_forwards", "draft_time_s",
             "verify_time_s", "ttft_s", "tpot_s", "decode_tok_s", "e2e_s", "policy_reason")}
