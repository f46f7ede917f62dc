"""The fields of a response that do not depend on the route: ids and timestamps, usage, logprobs in OpenAI's two
shapes, the per-request `speculative` stats and seed scope, and the prompt-prefix affinity a router keys on."""
from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any

from ..proposers.registry import get_method
from ..sampling_params import SamplingParams


def logprobs_content(tokenizer, lps: list) -> list[dict]:
    """Chat `choices[].logprobs.content`: per token its text, logprob, UTF-8 bytes and top alternatives."""
    def entry(token_id: int, logprob: float) -> dict:
        raw = tokenizer.token_bytes(token_id)
        return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}
    return [entry(t.token_id, t.logprob) | {"top_logprobs": [entry(i, v) for i, v in t.top]} for t in lps]


def completion_logprobs(tokenizer, lps: list, offset: int = 0) -> tuple[dict, int]:
    """Completions' `choices[].logprobs` (tokens, token_logprobs, top_logprobs, text_offset) for these tokens,
    their text offsets counted from `offset`; returns it and the offset after them."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in lps:
        text = tokenizer.token_bytes(t.token_id).decode("utf-8", "replace")
        out["tokens"].append(text)
        out["token_logprobs"].append(t.logprob)
        top = {tokenizer.token_bytes(i).decode("utf-8", "replace"): v for i, v in t.top}
        out["top_logprobs"].append(top | {text: t.logprob})
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(stats: Any, predicted: bool = False) -> dict:
    """OpenAI's usage object from a request's stats: `prompt_tokens_details.cached_tokens`, the prompt tokens the
    prefix cache supplied; with a prediction, `completion_tokens_details`' accepted and rejected prediction tokens
    (the prediction's draft tokens the target kept, and those it verified and turned down)."""
    out = {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
           "total_tokens": stats.prompt_tokens + stats.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}
    if predicted:
        accepted = stats.accepted_tokens
        out["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                            "rejected_prediction_tokens": stats.draft_tokens - accepted}
    return out


PREFIX_AFFINITY_TOKENS = 64     # a prompt's first tokens, hashed: its replica when the client names no spec_pool


def prefix_affinity(prompt_ids: list[int]) -> str:
    """The routing tag of a prompt without a spec_pool: a hash of its first tokens, so that a conversation's turns
    (and requests sharing a system prompt) go to the replica whose prefix cache holds them."""

    head = ",".join(map(str, prompt_ids[:PREFIX_AFFINITY_TOKENS]))
    return "prefix:" + hashlib.blake2b(head.encode(), digest_size=8).hexdigest()


def seed_scope(params: SamplingParams, method: str) -> str | None:
    """What a seed reproduces: None (no seed, or greedy: the output is the same under every method),
    "speculative_config" (the same seed with the same `speculative` method and k, as reported beside it, gives
    the same completion) or "policy" (method auto chose, and its choices depend on load and history)."""
    if params.seed is None or params.greedy:
        return None
    return "policy" if get_method(method).kind == "policy" else "speculative_config"


def speculative_stats(stats: Any, seed_scope: str | None = None) -> dict:
    """The per-request extension field: what speculation did for this request, and `seed_scope` (above)."""
    return {"seed_scope": seed_scope} | {k: getattr(stats, k) for k in
            ("method", "num_speculative_tokens", "draft_steps", "lookup_steps", "draft_tokens", "accepted_tokens",
             "acceptance_rate", "mean_accepted_length", "accepted_per_position", "target_forwards", "forced_tokens",
             "draft_time_s",
             "verify_time_s", "ttft_s", "tpot_s", "decode_tok_s", "e2e_s", "policy_reason")}
