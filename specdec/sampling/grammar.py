"""Structured outputs: a grammar (JSON schema, any JSON object, Lark, regex) constrains what a request may emit.

Built on llguidance (Rust; ~50 µs a token mask for a JSON schema on this CPU; xgrammar pulls Triton and
transformers at run time). Each constrained request holds a `Constraint` (one matcher):

- its masks go onto the target's logits at every row that samples: for a verification of draft d1..dk, row j
  gets the mask of the state after d1..dj (consumed, then rolled back), so the target's distribution p is the
  constrained one at every position; the rejection sampler is unchanged, and its exactness holds for any draft
  distribution q, so the output is distributed as plain constrained sampling from the target;
- the draft model drafts from the masked distribution (its q is that one), a lookup guess is cut at its first
  forbidden token (a forbidden token would be rejected for certain): no proposer proposes a forbidden token;
- where the grammar forces the next tokens (a JSON key, a closing brace), they are proposed as the draft without
  asking any proposer ("forced runs"): one-hot proposals, accepted with the constrained p(token), which is 1
  unless another tokenization of the same text is also allowed;
- committed tokens are consumed; a rejected draft's tokens never are.
"""
from __future__ import annotations

import itertools
import json
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import SpecDecError

# JSON as json.dumps writes it (", " and ": ", no other whitespace): what models write anyway, and it lets the
# grammar force more of the text; a schema's own "x-guidance" options override it
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class StructuredOutputs:
    """vLLM's `structured_outputs` fields: exactly one of them."""
    json: dict | str | None = None          # a JSON schema
    json_object: bool = False               # any JSON object
    grammar: str | None = None              # a Lark grammar (llguidance's dialect: %json {...} embeds a schema)
    regex: str | None = None

    def __post_init__(self):
        given = [n for n in ("json", "grammar", "regex") if getattr(self, n) is not None] + \
            (["json_object"] if self.json_object else [])
        if len(given) != 1:
            raise ValueError(f"structured outputs take exactly one of json, json_object, grammar, regex "
                             f"(got {', '.join(given) or 'none'})")

    def grammar_text(self) -> str:
        import llguidance as llg

        if self.json is not None:
            schema = json.loads(self.json) if isinstance(self.json, str) else self.json
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)
        if self.json_object:
            return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_STYLE)
        if self.grammar is not None:
            return llg.LLMatcher.grammar_from_lark(self.grammar)
        return llg.LLMatcher.grammar_from_regex(self.regex)


_ll_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # our Tokenizer -> llguidance's
_lock = threading.Lock()


def ll_tokenizer(tokenizer):
    """llguidance's view of our tokenizer (built once per tokenizer: ~1 s for a 150k vocabulary)."""
    import llguidance as llg

    with _lock:
        lt = _ll_tokenizers.get(tokenizer)
        if lt is None:
            lt = llg.LLTokenizer(llg.TokenizerWrapper(_TokenBytes(tokenizer)), n_vocab=tokenizer.vocab_size,
                                 eos_token=list(tokenizer.eos_token_ids))
            _ll_tokenizers[tokenizer] = lt
    return lt


class _TokenBytes:
    """Our tokenizer as llguidance's TokenizerWrapper reads it: each token's bytes, and which tokens are control
    tokens. (Built from the tokenizer JSON instead, llguidance 1.9 takes every added token for a control token:
    Qwen's `<tool_call>`, plain text to the tokenizer, could then not match the text "<tool_call>".)"""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = tokenizer.control_token_ids()

    def __call__(self, text: str) -> list[int]:
        # text as the model would write it: never a BOS (Gemma's tokenizer adds one to a prompt)
        return self._tokenizer.encode_text(text)


def _grammar_text(spec: StructuredOutputs) -> str:
    try:
        return spec.grammar_text()
    except (ValueError, TypeError) as exc:
        raise SpecDecError(f"invalid structured output: {exc}") from None


def check_grammar(spec: StructuredOutputs, tokenizer) -> str:
    """The grammar text for this spec; SpecDecError (one line) when it is not a valid grammar or schema."""
    import llguidance as llg

    text = _grammar_text(spec)
    err = llg.LLMatcher.validate_grammar(text, ll_tokenizer(tokenizer))
    if err:
        raise SpecDecError(f"invalid structured output: {' '.join(err.split())[:300]}")
    return text


class Constraint:
    """One request's grammar state."""

    def __init__(self, spec: StructuredOutputs, tokenizer):
        import llguidance as llg

        self.vocab_size = tokenizer.vocab_size
        self.eos_ids = list(tokenizer.eos_token_ids)
        self.eos_set = frozenset(self.eos_ids)
        self._drafted = 0
        # compiled once here (the server checked it with check_grammar before admission; a bad one errs here too)
        self.matcher = llg.LLMatcher(ll_tokenizer(tokenizer), _grammar_text(spec))
        if self.matcher.is_error():
            raise SpecDecError(f"invalid structured output: {self.matcher.get_error()}")

    # An end-of-sequence token is never consumed: it ends the request, and a matcher rolled back from the stopped
    # state it leads to is not the matcher it was (llguidance 1.9: measured, the next commit then fails).

    def advance(self, token: int) -> None:
        """Consume one drafted token; `rollback_draft` undoes what drafting consumed."""
        if token not in self.eos_set:
            self.matcher.consume_token(token)
            self._drafted += 1

    def rollback_draft(self) -> None:
        if self._drafted:
            self.matcher.rollback(self._drafted)
            self._drafted = 0

    def mask(self) -> torch.Tensor:
        """[V] bool: the tokens allowed next."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool))
        if not allowed.any():                     # an error state: only ending is left
            allowed[self.eos_ids] = True
        return allowed

    def forced(self, limit: int) -> list[int]:
        """Tokens the grammar forces next (at most `limit`)."""
        return list(self.matcher.compute_ff_tokens()[:limit]) if limit > 0 else []

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of these tokens the grammar allows in a row from here."""
        return self.matcher.validate_tokens(tokens) if tokens else 0

    def row_masks(self, draft: list[int]) -> torch.Tensor:
        """[len(draft) + 1, V] bool: the mask of each verification row (row j: after draft[:j])."""
        n_valid = self.valid_prefix(draft)
        n_ok = next((j for j, t in enumerate(draft[:n_valid]) if t in self.eos_set), n_valid)
        masks = [self.mask()]
        for j in range(len(draft)):
            if j < n_ok:
                self.matcher.consume_token(draft[j])
                masks.append(self.mask())
            else:   # unreachable rows: draft[n_ok] is rejected at row n_ok for sure, or is an end that ends it
                masks.append(masks[-1])
        if n_ok:
            self.matcher.rollback(n_ok)
        out = torch.stack(masks)
        if n_valid < len(draft) and out[n_valid].sum() > 1:
            out[n_valid, draft[n_valid]] = False     # what the matcher would not consume is never accepted
        return out

    def commit(self, tokens: list[int]) -> None:
        tokens = list(itertools.takewhile(lambda t: t not in self.eos_set, tokens))
        if tokens:
            self.matcher.consume_tokens(tokens)


def apply_masks(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """logits [R, V] with the forbidden tokens at -inf (a copy)."""
    return logits.masked_fill(~masks.to(logits.device), float("-inf"))


def warm(tokenizer) -> None:
    """Build llguidance's view of the tokenizer before serving (a server's first structured request should not
    pay ~1 s for it)."""
    ll_tokenizer(tokenizer)
