"""Incremental detokenization never emits half a character; deltas add up to the full decode."""
from specdec.tokenizer import IncrementalDetokenizer

TEXT = "naïve café — 你好，世界！🤖👍🏽 def f(x):\n    return x"


def test_deltas_concatenate_without_replacement_chars(tiny_models):
    tok = tiny_models[0].tokenizer
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    for step in (1, 2, 3):
        detok = IncrementalDetokenizer(tok)
        parts = [detok.add(ids[i: i + step]) for i in range(0, len(ids), step)]
        parts.append(detok.flush())
        assert all("\ufffd" not in p for p in parts)
        assert "".join(parts) == TEXT


def test_chat_template_renders_messages(tiny_models):
    tok = tiny_models[0].tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == tok._tok.token_to_id("<|im_start|>")
