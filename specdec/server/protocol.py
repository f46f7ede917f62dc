"""OpenAI's chat and completions request shapes (pydantic), plus specdec's extension fields (messages and tools:
messages.py; the error shape: api_errors.py; /tokenize: tokenize_protocol.py).

Requests are validated here and mapped onto `SamplingParams`; anything invalid becomes an `APIError` with
OpenAI's error shape and a 4xx status. Unknown fields are ignored (as OpenAI clients send many), but the
OpenAI fields that would change the answer and that specdec does not implement (tools, response_format,
logit_bias, ...) are declared and refused by `check_supported`, unless they hold their harmless default.
"""
from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config import K_MAX, K_MIN
from ..proposers.registry import METHOD_TABLE, method_names
from ..sampling.grammar import StructuredOutputs
from ..sampling.logprobs import MAX_TOP_LOGPROBS
from ..sampling_params import SamplingParams
from .api_errors import APIError, Text, shown, unsupported
from .messages import ChatMessage, NamedToolChoice, Prediction, Tool, ToolMode

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1      # seed: the range of OpenAI's and vLLM's int64 seed
MAX_CACHE_SALT = 1024     # characters; vLLM suggests 43 (256 random bits, base64)


# OpenAI fields refused with 400 (code unsupported_parameter, param: the field) unless they hold a harmless value:
# route -> {field: (a value refused, the harmless value that passes)}. README's list is generated from it, and
# tests/test_sampling_api.py sends every pair.
REFUSED_FIELDS = {
    "chat": {"functions": ([{"name": "f"}], []), "function_call": ("auto", "none"),
             "audio": ({"voice": "alloy", "format": "wav"}, None), "modalities": (["text", "audio"], ["text"])},
    "completions": {"functions": ([{"name": "f"}], []), "function_call": ("auto", "none"),
                    "audio": ({"voice": "alloy", "format": "wav"}, None), "modalities": (["text", "audio"], ["text"]),
                    "tools": ([{"type": "function", "function": {"name": "f"}}], None), "tool_choice": ("auto", "none"),
                    "suffix": ("x", ""), "best_of": (2, 1)},
}


def refused_markdown() -> str:
    """README's list of refused fields, by route, each with its harmless value."""
    import json

    lines = []
    for route, fields in REFUSED_FIELDS.items():
        cells = [f"`{name}` (passes: `{json.dumps(ok)}`)" for name, (_, ok) in fields.items()]
        lines.append(f"- {'chat completions' if route == 'chat' else 'completions'}: {', '.join(cells)}")
    return "\n".join(lines)


def _method_enum(schema: dict) -> None:
    """The schema's choices are the method table's when the schema is built (after plugins have loaded)."""
    schema["enum"] = [*method_names(), None]


class SpeculativeOverride(BaseModel):
    """Per-request extension: `"speculative": {"method": "none"}` or `{"num_speculative_tokens": 2}`; any declared
    method (the method table, plugins included) may be named, and the server answers 400 for one it does not
    run (/v1/speculative/status lists those it does)."""
    model_config = ConfigDict(extra="forbid")
    method: str | None = Field(default=None, json_schema_extra=_method_enum)

    @field_validator("method")
    @classmethod
    def _declared(cls, value: str | None) -> str | None:
        if value is not None and value not in METHOD_TABLE:
            raise ValueError(f"unknown speculative method '{value}' (choose from: {', '.join(method_names())})")
        return value
    num_speculative_tokens: int | None = Field(default=None, ge=K_MIN, le=K_MAX)
    eagle_topk: int | None = Field(default=None, ge=1, le=16)       # a head's token tree (greedy requests)
    num_steps: int | None = Field(default=None, ge=1, le=K_MAX)
    draft_p_min: float | None = Field(default=None, ge=0, lt=1)      # the draft model's chain stops below it


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=2 ** 31 - 1)      # -1 or 0: off; past the vocabulary: off
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=128)      # choices (OpenAI's bound), one prefill shared
    ignore_eos: bool = False
    # penalties and bias (OpenAI's, and vLLM's repetition_penalty and min_tokens): exact under speculation
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=100)
    logit_bias: dict[str, float] | None = None      # token id (as a string) -> bias in [-100, 100]
    min_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool | int | None = None
    speculative: SpeculativeOverride | None = None
    spec_pool: Text | None = Field(default=None, min_length=1, max_length=64)   # acceptance pool tag (method auto)
    # vLLM's field: the prefix cache (and suffix pools) reuse only requests with the same salt, within the API key's
    # tenant (admission.cache_partition)
    cache_salt: Text | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT)
    # OpenAI fields specdec does not implement: declared so they are refused (400 naming the field) instead of
    # silently dropped; their harmless defaults pass (see check_supported).
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: Any = None
    structured_outputs: dict[str, Any] | None = None     # vLLM's extension: {"json" | "regex" | "grammar" | ...}
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    prediction: Prediction | None = None
    audio: Any = None
    modalities: list[Any] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.strip().isdigit():
                raise ValueError(f"keys must be token ids written as strings (\"1234\"), got '{shown(key, 20)}'")
            if not -100 <= bias <= 100:
                raise ValueError(f"values must be in [-100, 100], got {bias} for token {key}")
        return value

    def check_supported(self) -> None:
        """Refuse what would change the answer and is not implemented (before admission: costs nothing)."""
        self.logprobs_count()
        _ = self.tool_mode
        if self.functions:
            raise unsupported("functions", "function calling (functions) is")
        if self.function_call not in (None, "none"):
            raise unsupported("function_call", "function calling (function_call other than 'none') is")
        _ = self.structured
        if self.audio is not None:
            raise unsupported("audio", "audio output is")
        if self.modalities is not None and self.modalities != ["text"]:
            raise unsupported("modalities", "modalities other than [\"text\"] are")

    @functools.cached_property
    def tool_mode(self) -> ToolMode | None:
        """What the request's tools ask (computed once; errors are raised on every access). Completions take no
        tools: chat completions override this."""
        if self.tools:
            raise unsupported("tools", "tool calling (tools) is")
        if self.tool_choice not in (None, "none"):
            raise unsupported("tool_choice", "tool calling (tool_choice other than 'none') is")
        return None

    @functools.cached_property
    def structured(self) -> StructuredOutputs | None:
        """response_format (OpenAI: text, json_object, json_schema) or vLLM's structured_outputs -> the grammar spec,
        computed once. Its grammar is checked against the tokenizer later (see sampling.grammar.check_grammar)."""
        rf, so = self.response_format, self.structured_outputs
        mode = self.tool_mode
        if mode is not None and mode.forced:
            if (rf is not None and rf != {"type": "text"}) or so is not None:
                raise APIError(400, "tool_choice 'required' or a named function cannot be combined with "
                                    "response_format or structured_outputs", param="tool_choice")
            from .tools import call_grammar

            return call_grammar(mode.tools, mode.name)
        if rf is not None and so is not None:
            raise APIError(400, "give response_format or structured_outputs, not both", param="structured_outputs")
        if so is not None:
            unknown = set(so) - {"json", "json_object", "regex", "grammar"}
            if unknown:
                raise APIError(400, f"structured_outputs: unknown key '{sorted(unknown)[0]}' (known: grammar, json, "
                                    "json_object, regex)", param="structured_outputs")
            try:
                return StructuredOutputs(**so)
            except (TypeError, ValueError) as exc:
                raise APIError(400, f"structured_outputs: {exc}", param="structured_outputs") from None
        if rf is None:
            return None
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutputs(json_object=True)
        if kind == "json_schema":
            js = rf.get("json_schema")
            schema = js.get("schema") if isinstance(js, dict) else None
            if not isinstance(schema, dict):
                raise APIError(400, "response_format json_schema needs json_schema.schema (a JSON schema object)",
                               param="response_format.json_schema.schema")
            return StructuredOutputs(json=schema)
        raise APIError(400, "response_format.type must be 'text', 'json_object' or 'json_schema'",
                       param="response_format.type")

    def logprobs_count(self) -> int | None:
        """None (no logprobs), or how many most-likely tokens to list beside each emitted token's logprob.
        Chat: `logprobs: true` with `top_logprobs` 0..20; completions: `logprobs` 0..20 (OpenAI allows 5, vLLM 20)."""
        raise NotImplementedError

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        self.check_supported()
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise APIError(400, "stop strings must be non-empty", param="stop")
        if len(stop) > 16:
            raise APIError(400, "at most 16 stop strings", param="stop")
        if self.min_tokens and self.min_tokens > max_tokens:
            raise APIError(400, f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({max_tokens})",
                           param="min_tokens")
        return SamplingParams(max_tokens=max_tokens, temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or -1,
                              min_p=self.min_p or 0.0, seed=self.seed, stop=stop, ignore_eos=self.ignore_eos,
                              logprobs=self.logprobs_count(), structured_outputs=self.structured,
                              presence_penalty=self.presence_penalty or 0.0,
                              frequency_penalty=self.frequency_penalty or 0.0,
                              repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                              logit_bias={int(k): float(v) for k, v in self.logit_bias.items()} if self.logit_bias
                              else None, min_tokens=self.min_tokens or 0)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None

    @functools.cached_property
    def tool_mode(self) -> ToolMode | None:
        """None when no tool is in play (no tools, or tool_choice 'none')."""
        choice = self.tool_choice
        if not self.tools:
            if choice not in (None, "none"):
                raise APIError(400, "tool_choice needs tools", param="tool_choice")
            return None
        tools = [t.model_dump(exclude_none=True) for t in self.tools]
        if choice is None or choice == "auto":
            return ToolMode(tools, "auto", None)
        if choice == "none":
            return None
        if choice == "required":
            return ToolMode(tools, "required", None)
        names = [t["function"]["name"] for t in tools]
        if choice.function.name not in names:
            raise APIError(400, f"tool_choice names '{shown(choice.function.name)}', which is not among the tools "
                                f"({', '.join(names)})", param="tool_choice.function.name")
        return ToolMode(tools, "named", choice.function.name)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprobs_count(self) -> int | None:
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            raise APIError(400, "logprobs must be a boolean for chat completions (use top_logprobs for a count)",
                           param="logprobs")
        if not self.logprobs:
            if self.top_logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        return self.top_logprobs or 0


class CompletionRequest(_Sampling):
    prompt: Text | list[Text] | list[int] | list[list[int]] = Field(min_length=1)   # a batch of one: as lm-eval
    max_tokens: int | None = Field(default=None, ge=0)     # 0: with echo, the prompt alone (scoring it)
    echo: bool = False              # the prompt before the completion, and with logprobs its tokens' logprobs
    suffix: str | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.max_tokens == 0 and not self.echo:
            raise APIError(400, "max_tokens must be >= 1 (0 only with echo: the prompt scored, nothing generated)",
                           param="max_tokens")
        if self.suffix:
            raise unsupported("suffix", "suffix (insertion) is")
        if self.best_of is not None and self.best_of != 1:
            raise unsupported("best_of", "best_of other than 1 is")

    def requested_max_tokens(self) -> int | None:
        # max_tokens 0 (echo): the engine samples one token after the prompt, which the response leaves out
        return None if self.max_tokens is None else max(1, self.max_tokens)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        params = super().sampling_params(max_tokens)
        if self.echo and params.logprobs is not None:
            params.prompt_logprobs = params.logprobs
        return params

    def logprobs_count(self) -> int | None:
        if self.top_logprobs:
            raise APIError(400, "top_logprobs is a chat completions field; completions take logprobs: N",
                           param="top_logprobs")
        if self.logprobs is None:
            return None
        if isinstance(self.logprobs, bool) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] for completions",
                           param="logprobs")
        return self.logprobs


