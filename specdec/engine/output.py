"""What the engine hands back per step and per finished request."""
from __future__ import annotations

from dataclasses import dataclass

from ..metrics.stats import RequestStats
from ..sampling.logprobs import TokenLogprob


@dataclass
class StreamDelta:
    text: str                       # new text (never half a character; stop strings held back)
    token_ids: list[int]            # tokens committed in this step
    finished: bool
    finish_reason: str | None
    stats: RequestStats | None = None   # set on the last delta
    logprobs: list[TokenLogprob] | None = None   # per token of token_ids, when the request asked for logprobs
    prompt_logprobs: list[TokenLogprob | None] | None = None   # on the first delta, when asked (None: first token)


@dataclass
class StepOutput:
    """One request's part of a step: a delta, or the error that ended it (that request only)."""
    request_id: str
    delta: StreamDelta | None
    error: Exception | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stats: RequestStats
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class StepInfo:
    """The shape of the last forward (the server's histograms read it)."""
    num_seqs: int = 0
    num_rows: int = 0
    num_prefill_tokens: int = 0
    num_draft_tokens: int = 0
    num_preempted: int = 0                  # sequences preempted (their caches freed) to make room for it
