"""A tokenizer built from a GGUF file's metadata (`tokenizer.ggml.*`): the vocabulary, merges and pre-tokenizer
pattern, its control and user-defined tokens, EOS/BOS and the chat template. `Tokenizer.from_gguf` wraps it."""
from __future__ import annotations

from .errors import SpecDecError

SPACE = "\u2581"      # SentencePiece's spelling of a space

# Pre-tokenizer split patterns, by GGUF `tokenizer.ggml.pre`.
_PRE_PATTERNS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",  # noqa: E501
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",  # noqa: E501
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}
_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED, _TOKEN_UNUSED = 1, 3, 4, 5

# Gemma's chat template (instruction-tuned Gemma 3 files carry it; base files, like the 270M on the registry, do
# not): no system role, so a system message is folded into the first user turn; assistant turns are "model".
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = (messages[0]['content'] if messages[0]['content'] is string "
    "else messages[0]['content'] | map(attribute='text') | join('')) + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' "
    "+ (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
# End-of-turn tokens a GGUF may not name (llama.cpp finds them by their text too).
_EOT_TEXTS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>")


def gguf_tokenizer(reader) -> tuple[object, dict]:
    """(a `tokenizers` Tokenizer, its metadata) from a GGUF file's vocabulary: byte-level BPE (`gpt2`: Qwen, Llama)
    or SentencePiece BPE (`llama`: Gemma)."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    from .gguf_file import field

    kind = field(reader, "tokenizer.ggml.model")
    if kind == "llama":
        return _sentencepiece(reader)
    if kind != "gpt2":
        raise SpecDecError(f"unsupported GGUF tokenizer model '{kind}' (supported: byte-level BPE 'gpt2', "
                           "SentencePiece BPE 'llama')")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type") or [_TOKEN_NORMAL] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    pre = field(reader, "tokenizer.ggml.pre", "gpt2")
    pattern = _PRE_PATTERNS.get(pre, _PRE_PATTERNS["gpt2"])

    tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    _add_gguf_tokens(tok, tokens, types)
    return tok, _gguf_meta(reader, tokens, add_bos_default=False)


def _sentencepiece(reader) -> tuple[object, dict]:
    """A SentencePiece BPE vocabulary (Gemma's; `tokenizer.ggml.model = llama`) as a tokenizers BPE with byte
    fallback: spaces become U+2581 before the merges and back after, `<0xNN>` pieces stand for bytes the
    vocabulary lacks. The file lists no merges, so they are rebuilt from the vocabulary: every way to cut a
    token into two tokens is a merge, ranked by the token's place in the file (Gemma's scores do not follow its
    merge order; the order of the file does), which is how transformers reads these files."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    from .gguf_file import field

    # runs of spaces are stored as spaces; the merges work on the U+2581 spelling
    tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in field(reader, "tokenizer.ggml.tokens")]
    types = field(reader, "tokenizer.ggml.token_type") or [_TOKEN_NORMAL] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token in tokens:          # in file order: earlier tokens merge first
        cuts = [(token[:j], token[j:]) for j in range(1, len(token)) if token[:j] in vocab and token[j:] in vocab]
        merges += sorted(cuts, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    unk = field(reader, "tokenizer.ggml.unknown_token_id")
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                 unk_token=None if unk is None else tokens[int(unk)]))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(" "), behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    _add_gguf_tokens(tok, tokens, types)
    return tok, _gguf_meta(reader, tokens, add_bos_default=True)


def _add_gguf_tokens(tok, tokens: list[str], types: list[int]) -> None:
    """The file's control tokens as special added tokens, its user-defined ones (`<tool_call>`, Gemma's newline runs)
    as plain added tokens: each matched whole in text, never cut by the merges."""
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == _TOKEN_CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, kind in zip(tokens, types) if kind == _TOKEN_USER_DEFINED])


def _gguf_meta(reader, tokens: list[str], add_bos_default: bool) -> dict:
    """EOS ids (the file's eos and eot, and an end-of-turn token it has but does not name), BOS, and the chat
    template (Gemma's own for a Gemma file without one). A SentencePiece file that does not say adds BOS, as
    llama.cpp does."""
    from .gguf_file import field

    eos_ids = [int(e) for e in (field(reader, "tokenizer.ggml.eos_token_id"),
                                field(reader, "tokenizer.ggml.eot_token_id")) if e is not None]
    index = {t: i for i, t in enumerate(tokens) if t in _EOT_TEXTS}
    eos_ids += [index[t] for t in _EOT_TEXTS if t in index]
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    template = field(reader, "tokenizer.chat_template")
    if template is None and str(field(reader, "general.architecture", "")).startswith("gemma"):
        template = GEMMA_CHAT_TEMPLATE
    return {
        "eos_token_ids": list(dict.fromkeys(eos_ids)),
        "bos_token_id": None if bos is None else int(bos),
        "add_bos": bool(field(reader, "tokenizer.ggml.add_bos_token", add_bos_default)),
        "chat_template": template,
    }
