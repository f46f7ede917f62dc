"""A request's repetition penalties, logit bias and min_tokens (vLLM's SamplingParams fields), applied to the target's
logits at every verification row from that row's own prefix: the prompt, the output so far, and the draft tokens
before the row. The draft applies the same to its own logits at each token it drafts, so its q is the distribution
it sampled from; either way the verifier's test keeps the output the penalised target's.

Order (vLLM's): logit_bias and min_tokens, then repetition, frequency and presence penalties; temperature, top-k,
top-p and min-p come after (sampling/logits.py). Presence and frequency count output tokens only (OpenAI's and
vLLM's); the repetition penalty counts the prompt's tokens too (HF's and vLLM's)."""
from __future__ import annotations

import torch


class Penalties:
    """One request's adjustments; `prompt_ids` and `output_ids` are the sequence's own lists (read, never written),
    so the object follows the request as it commits tokens."""

    def __init__(self, params, prompt_ids: list[int], output_ids: list[int], stop_ids: frozenset[int]):
        self.presence = params.presence_penalty
        self.frequency = params.frequency_penalty
        self.repetition = params.repetition_penalty
        self.bias = dict(params.logit_bias or {})
        self.min_tokens = params.min_tokens
        self.stop_ids = sorted(stop_ids)
        self.prompt_ids, self.output_ids = prompt_ids, output_ids
        self._dense: dict[tuple, tuple] = {}

    def _constants(self, vocab: int, device) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The bias as a dense row, the prompt's tokens as a mask and the stop ids min_tokens masks, built once per
        vocabulary width and device."""
        key = (vocab, str(device))
        if key not in self._dense:
            bias = None
            if self.bias:
                bias = torch.zeros(vocab, device=device)
                ids = [t for t in self.bias if t < vocab]
                bias[torch.tensor(ids, dtype=torch.long, device=device)] = torch.tensor(
                    [float(self.bias[t]) for t in ids], device=device)
            seen = None
            if self.repetition != 1.0:
                seen = torch.zeros(vocab, dtype=torch.bool, device=device)
                ids = [t for t in self.prompt_ids if t < vocab]
                if ids:
                    seen[torch.tensor(ids, dtype=torch.long, device=device)] = True
            stops = torch.tensor([t for t in self.stop_ids if t < vocab], dtype=torch.long, device=device)
            self._dense[key] = (bias, seen, stops)
        return self._dense[key]

    def apply(self, logits: torch.Tensor, drafted: list[int]) -> torch.Tensor:
        """logits [R, V] -> an adjusted copy (fp32). Row j's prefix is the output so far and drafted[:lead + j],
        lead = len(drafted) - (R - 1): a verification passes its k + 1 rows and its k draft tokens (row j after the
        first j), a draft step its one row and the tokens drafted before it."""
        R, V = logits.shape
        device = logits.device
        logits = logits.float().clone()
        bias, prompt_seen, stops = self._constants(V, device)
        if bias is not None:
            logits += bias
        lead = len(drafted) - (R - 1)                       # drafted tokens every row's prefix holds
        if self.min_tokens:
            done = len(self.output_ids) + lead + torch.arange(R, device=device)
            short = done < self.min_tokens
            if bool(short.any()) and len(stops):
                rows = logits[short]
                rows[:, stops] = float("-inf")
                logits[short] = rows
        if self.presence == 0.0 and self.frequency == 0.0 and self.repetition == 1.0:
            return logits
        counts = torch.zeros(V, device=device)
        base = [t for t in [*self.output_ids, *drafted[:max(lead, 0)]] if t < V]
        if base:
            counts += torch.bincount(torch.tensor(base, dtype=torch.long, device=device), minlength=V)[:V].float()
        counts = counts.expand(R, V).clone()
        for j in range(1, R):                              # row j also holds the draft tokens before it
            t = drafted[lead + j - 1]
            if t < V:
                counts[j:, t] += 1.0
        if self.repetition != 1.0:
            seen = counts > 0
            if prompt_seen is not None:
                seen |= prompt_seen
            scaled = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
            logits = torch.where(seen, scaled, logits)
        if self.frequency:
            logits -= self.frequency * counts
        if self.presence:
            logits -= self.presence * (counts > 0).float()
        return logits


def wants_penalties(params) -> bool:
    """Whether a request's params adjust the logits at all (most do not: the step skips the work)."""
    return bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0
                or params.logit_bias or params.min_tokens)
