"""Per-request statistics: plain data; the CLI's JSON, logs and (later) Prometheus all read this."""
from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass, field

from ..config import PLAIN


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


@dataclass
class RequestStats:
    method: str = PLAIN
    num_speculative_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0              # prompt tokens whose K/V came from the prefix cache (OpenAI's
                                        # usage.prompt_tokens_details.cached_tokens)
    completion_tokens: int = 0
    finish_reason: str | None = None
    ttft_s: float = 0.0                 # request start -> first token
    tpot_s: float = 0.0                 # (e2e - ttft) / (completion_tokens - 1)
    decode_tok_s: float = 0.0           # tokens after the first / time after the first
    e2e_s: float = 0.0
    target_forwards: int = 0            # decode-phase target forwards (prefill excluded)
    draft_steps: int = 0                # target forwards that verified a non-empty draft
    draft_tokens: int = 0
    accepted_tokens: int = 0
    lookup_steps: int = 0               # draft steps that verified a prompt-lookup guess (auto, hybrid: those
                                        # their step controller gave to lookup; ngram: all)
    forced_steps: int = 0               # structured outputs: draft steps that verified tokens the grammar forced
    forced_tokens: int = 0              # ... and the forced tokens accepted there
    acceptance_rate: float | None = None          # accepted / drafted
    mean_accepted_length: float | None = None     # 1 + accepted / draft_steps (bonus included; vLLM)
    accepted_per_position: list[float] = field(default_factory=list)  # acceptance at draft position 1..k
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    peak_rss_mb: float = 0.0
    policy_reason: str | None = None    # why this method and k (method "auto"), or None for a fixed config
    # raw per-position counts, kept to aggregate across requests
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_counts_per_position: list[int] = field(default_factory=list)

    def observe_draft(self, num_draft: int, num_accepted: int) -> None:
        if num_draft == 0:
            return
        self.draft_steps += 1
        self.draft_tokens += num_draft
        self.accepted_tokens += num_accepted
        grow = num_draft - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_counts_per_position += [0] * grow
        for i in range(num_draft):
            self.drafted_per_position[i] += 1
            if i < num_accepted:
                self.accepted_counts_per_position[i] += 1

    def finalize(self, start: float, first_token: float | None, end: float) -> None:
        self.e2e_s = end - start
        self.ttft_s = (first_token - start) if first_token is not None else self.e2e_s
        after_first = self.e2e_s - self.ttft_s
        if self.completion_tokens > 1 and after_first > 0:
            self.tpot_s = after_first / (self.completion_tokens - 1)
            self.decode_tok_s = (self.completion_tokens - 1) / after_first
        if self.draft_tokens:
            self.acceptance_rate = self.accepted_tokens / self.draft_tokens
        if self.draft_steps:
            self.mean_accepted_length = 1 + self.accepted_tokens / self.draft_steps
        self.accepted_per_position = [a / d if d else 0.0 for a, d in
                                      zip(self.accepted_counts_per_position, self.drafted_per_position)]
        self.peak_rss_mb = peak_rss_mb()

    def to_dict(self) -> dict:
        return asdict(self)
