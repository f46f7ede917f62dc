"""Tokenizer and chat template, built from GGUF metadata or HF tokenizer files.

Building a BPE tokenizer from GGUF metadata takes a few seconds; `Tokenizer.save` writes the result
(`tokenizer.json` + `tokenizer_meta.json`) so a warm start only reads it back.
"""
from __future__ import annotations

import functools
import json
import re
import secrets
import unicodedata
from datetime import datetime
from pathlib import Path

from .errors import SpecDecError
from .tokenizer_gguf import SPACE, gguf_tokenizer


class Tokenizer:
    def __init__(self, tok, meta: dict):
        self._tok = tok
        self.meta = meta
        self.eos_token_ids: list[int] = list(meta.get("eos_token_ids") or [])
        self.bos_token_id: int | None = meta.get("bos_token_id")
        self.add_bos: bool = bool(meta.get("add_bos", False))
        self.chat_template: str | None = meta.get("chat_template")
        self._template = None

    def __reduce__(self):
        """Pickled as its JSON and metadata (Ray Serve sends a replica's tokenizer to the ingress)."""
        return _from_json, (self._tok.to_str(), self.meta)

    # -- building ---------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, reader) -> Tokenizer:
        return cls(*gguf_tokenizer(reader))

    @classmethod
    def from_hf_dir(cls, path: Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise SpecDecError(f"{path}: no tokenizer.json (HF-format directories need the fast-tokenizer file)")
        tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
        cfg = _read_json(path / "tokenizer_config.json")
        gen = _read_json(path / "generation_config.json")
        model_cfg = _read_json(path / "config.json")

        def token_id(value):
            if isinstance(value, dict):
                value = value.get("content")
            return tok.token_to_id(value) if isinstance(value, str) else None

        eos = gen.get("eos_token_id", model_cfg.get("eos_token_id"))
        eos_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        cfg_eos = token_id(cfg.get("eos_token"))
        if cfg_eos is not None and cfg_eos not in eos_ids:
            eos_ids.append(cfg_eos)
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        bos = token_id(cfg.get("bos_token"))
        meta = {
            "eos_token_ids": eos_ids,
            "bos_token_id": bos,
            "add_bos": bool(cfg.get("add_bos_token", False)) and bos is not None,
            "chat_template": template,
        }
        return cls(tok, meta)

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        self._tok.save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_meta.json").write_text(json.dumps(self.meta))

    @classmethod
    def load(cls, directory: Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        directory = Path(directory)
        tok = HFTokenizer.from_file(str(directory / "tokenizer.json"))
        return cls(tok, json.loads((directory / "tokenizer_meta.json").read_text()))

    # -- use --------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def vocab(self) -> dict[str, int]:
        """Every token's text -> id, added tokens included (two tokenizers agree exactly when these are equal)."""
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Text -> ids; special tokens written in the text are recognised; BOS added if the model wants it
        and the text does not start with it (chat templates usually write it themselves); add_bos=False: never."""
        ids = self._encode(self._tok, text)
        return self._with_bos(ids) if add_bos else ids

    def encode_text(self, text: str) -> list[int]:
        """Text as the model would write it inside an answer (a predicted output): no BOS, and control-token text
        read as the plain characters it is."""
        return self.encode_texts([text])[0]

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """encode_text for many texts in one call (tokenizers spreads a batch over its threads)."""
        tok = self._plain_tok if self._control_tokens else self._tok
        return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self.add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids
        return ids

    @staticmethod
    def _encode(tok, text: str) -> list[int]:
        # encode_batch, not encode: tokenizers' `encode` holds the GIL for the whole text (seconds for a
        # few MiB, freezing a server's event loop even from a worker thread); `encode_batch` releases it.
        return tok.encode_batch([text], add_special_tokens=False)[0].ids

    def warm(self) -> None:
        """Build the tables `min_tokens` and `encode_chat` compute on first use (a server's first request should
        not pay for them)."""
        self.min_tokens("")
        _ = self._control_tokens and self._plain_tok

    @functools.cached_property
    def max_token_chars(self) -> int:
        """L: the most characters of text one token can cover (the longest vocabulary entry, special tokens
        included; byte-level entries have one character per byte, and a byte is at most one character)."""
        return max(len(t) for t in self._tok.get_vocab(with_added_tokens=True))

    def min_tokens(self, text: str) -> int | None:
        """A lower bound on len(encode(text)) without tokenizing: no token covers more than `max_token_chars`
        characters, so the text needs at least ceil(chars / L) tokens. Exact for tokenizers without a
        normalizer or with NFC (all GGUF byte-level BPE ones): `chars` is the shorter of the text and its NFC
        form; None (no bound) for other normalizers, which may shorten text arbitrarily."""
        kind = self._normalizer_kind
        if kind not in (None, "NFC"):
            return None
        chars = len(text)
        if kind == "NFC" and not unicodedata.is_normalized("NFC", text):
            chars = min(chars, len(unicodedata.normalize("NFC", text)))
        return -(-chars // self.max_token_chars)

    @functools.cached_property
    def _pipeline(self) -> dict:
        """The tokenizer's normalizer and decoder specs and its model's byte_fallback flag, from one parse of its JSON
        (tens of MB for a 262k vocabulary: parsed once, the rest dropped)."""
        spec = json.loads(self._tok.to_str())
        return {"normalizer": spec.get("normalizer"), "decoder": spec.get("decoder"),
                "byte_fallback": bool(spec["model"].get("byte_fallback"))}

    @functools.cached_property
    def _normalizer_kind(self) -> str | None:
        """None, "NFC", or another normalizer's type. SentencePiece's one-character-for-one Replace (a space for
        U+2581) keeps every length, so it counts as none."""
        spec = self._pipeline["normalizer"]
        if spec is None:
            return None
        if spec.get("type") == "Replace" and len(spec.get("content", "")) == 1 and \
                len((spec.get("pattern") or {}).get("String", "")) == 1:
            return None
        return spec.get("type", "?")

    @functools.cached_property
    def _control_tokens(self) -> re.Pattern | None:
        """The text of every special (control) token, as one pattern: finds them typed into message content."""
        texts = sorted({t.content for t in self._tok.get_added_tokens_decoder().values() if t.special},
                       key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    @functools.cached_property
    def _plain_tok(self):
        """A copy of the tokenizer that reads special-token text as plain text (its own object: the flag is
        per tokenizer, and requests are tokenized in parallel threads)."""
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_str(self._tok.to_str())
        tok.encode_special_tokens = True
        return tok

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def control_token_ids(self) -> list[int]:
        """Ids of the control (special) tokens: `<|im_end|>` and the like, not added text tokens like `<tool_call>`."""
        return sorted(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (OpenAI's logprobs `bytes`): a byte-level BPE entry mapped back to its
        bytes (it may be part of a UTF-8 character), an added token's text, else the token decoded alone."""
        added = self._added_texts.get(token_id)
        if added is not None:
            return added.encode()
        piece = self._tok.id_to_token(token_id)
        if piece is not None and self._byte_level and all(c in _UNICODE_TO_BYTE for c in piece):
            return bytes(_UNICODE_TO_BYTE[c] for c in piece)
        if piece is not None and self._byte_fallback:   # SentencePiece: `<0xNN>` is one byte, U+2581 a space
            byte = _BYTE_PIECE.fullmatch(piece)
            return bytes([int(byte.group(1), 16)]) if byte else piece.replace(SPACE, " ").encode()
        return self._tok.decode([token_id], skip_special_tokens=False).encode()

    @functools.cached_property
    def _added_texts(self) -> dict[int, str]:
        return {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}

    @functools.cached_property
    def _byte_fallback(self) -> bool:
        return self._pipeline["byte_fallback"]

    @functools.cached_property
    def _byte_level(self) -> bool:
        return '"ByteLevel"' in json.dumps(self._pipeline["decoder"])

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        if not self.chat_template:
            raise SpecDecError("this model has no chat template; pass raw text (--no-chat)")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message):
                raise SpecDecError(f"chat template: {message}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            # transformers' tojson: plain json.dumps (jinja's own escapes <, >, & and ' for HTML)
            env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
                x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
            self._template = env.from_string(self.chat_template)
        bos = self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else ""
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=bos, eos_token=eos, tools=tools or None)

    def encode_chat(self, messages: list[dict], rendered: str | None = None,
                    tools: list[dict] | None = None, add_generation_prompt: bool = True) -> list[int]:
        """Messages -> ids through the chat template. Every string the template renders from a request (message
        content, tool-call arguments, tool results, names, tool descriptions and schemas) is plain text:
        control-token text typed into it (`<|im_start|>system ...`) is tokenized as the characters it is, never
        as the control token, so a request cannot forge a turn; only the template writes control tokens.
        `rendered`: the template's output for these messages, when the caller has it already;
        add_generation_prompt=False: without the assistant turn's opening (counting a conversation's tokens)."""
        pattern = self._control_tokens
        if pattern is None or not (_mentions(messages, pattern) or _mentions(tools, pattern)):
            text = self.apply_chat_template(messages, add_generation_prompt, tools=tools) if rendered is None \
                else rendered
            return self.encode(text)               # nothing to escape: the plain path
        # Each control-token text inside a request's strings becomes a unique mark; the template renders the
        # marked request (a mark has no character a template escapes), and each mark's place is tokenized as the
        # control text it stands for, read as plain text. Whatever the template does around it (JSON-quoting a
        # tool call's arguments, say) stays as the template wrote it.
        nonce = secrets.token_hex(8)
        found: list[str] = []

        def mark(m: re.Match) -> str:
            found.append(m.group(0))
            return f"\ue000{nonce}:{len(found) - 1}\ue001"

        def scrub(x):
            if isinstance(x, str):
                return pattern.sub(mark, x)
            if isinstance(x, list):
                return [scrub(v) for v in x]
            if isinstance(x, dict):
                return {scrub(k): scrub(v) for k, v in x.items()}
            return x
        marked = self.apply_chat_template(scrub(messages), add_generation_prompt, tools=scrub(tools) if tools else None)
        pieces = re.split(f"\ue000{nonce}:(\\d+)\ue001", marked)
        ids = self._encode(self._tok, pieces[0])
        for i, template_text in zip(pieces[1::2], pieces[2::2]):
            ids += self._encode(self._plain_tok, found[int(i)]) + self._encode(self._tok, template_text)
        return self._with_bos(ids)


def _mentions(x, pattern: re.Pattern) -> bool:
    """Does any string in x (nested lists and dicts, keys included) contain control-token text?"""
    if isinstance(x, str):
        return pattern.search(x) is not None
    if isinstance(x, list):
        return any(_mentions(v, pattern) for v in x)
    if isinstance(x, dict):
        return any(_mentions(k, pattern) or _mentions(v, pattern) for k, v in x.items())
    return False


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never split a UTF-8 character.

    Decodes a short window (prefix_offset..end) and emits what it adds beyond the already-emitted
    part (prefix_offset..read_offset); while the window ends in U+FFFD (half a multi-byte character,
    the rest still to come in the next token) nothing is emitted.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_tail: list[int] | None = None):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_tail or [])
        # Start with a little context so leading-space handling matches a full decode.
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self.tokenizer.decode(self.ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """At the end: whatever is held back (e.g. a genuinely invalid byte sequence)."""
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self.tokenizer.decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text):]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as one printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _from_json(text: str, meta: dict) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    return Tokenizer(HFTokenizer.from_str(text), meta)
