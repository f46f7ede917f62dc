"""Shared fixtures: tiny random-init Qwen2 models in HF format, with a small byte-level BPE tokenizer."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from model_cache import private_cache

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ("def add(a, b):\n    return a + b\n\nclass Cache:\n    def rollback(self, n):\n        self.length = n\n"
          "The quick brown fox jumps over the lazy dog. 你好，世界！ Speculative decoding drafts tokens. ") * 20


def make_tokenizer(directory: Path, vocab_size: int = 320) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS], trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHATML}))
    return tok.get_vocab_size()


def make_tiny_model(directory: Path, seed: int = 0, tokenizer_vocab: int = 320, weight_std: float = 0.3,
                    **overrides) -> Path:
    """A random-init Qwen2 in HF format (config.json + model.safetensors + tokenizer files)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(directory, tokenizer_vocab)
    cfg = dict(vocab_size=vocab + 4, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0,
               rms_norm_eps=1e-6, tie_word_embeddings=False)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**cfg))
    with torch.no_grad():  # larger-than-default weights make greedy outputs less degenerate
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, weight_std)
            elif p.dim() == 1 and p.shape[0] != cfg["hidden_size"]:
                p.normal_(0, 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


SESSION_CACHE = os.environ.get("SPECDEC_CACHE")      # what the user's own runs read (usually unset)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch, request):
    """Unit tests write conversions to a private cache; real-model tests use the user's cache, where a converted
    model is kept from one run to the next (a fixture that leaves SPECDEC_CACHE changed would make every run convert
    the real models again, into a temporary directory)."""
    if request.node.get_closest_marker("real_models") is None:
        monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path_factory.getbasetemp() / "specdec-cache"))
    else:
        assert os.environ.get("SPECDEC_CACHE") == SESSION_CACHE, \
            "a fixture left SPECDEC_CACHE changed (use model_cache.private_cache)"


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny")
    return {
        "target": make_tiny_model(base / "target", seed=0),
        "draft": make_tiny_model(base / "draft", seed=1, num_hidden_layers=1),
        "other_vocab": make_tiny_model(base / "other_vocab", seed=2, tokenizer_vocab=300),
    }


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs, tmp_path_factory):
    """Loaded fp32 tiny target and draft (LoadedModel)."""
    from specdec.models.loader import load_model

    with private_cache(tmp_path_factory):
        target = load_model(str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False)
        draft = load_model(str(tiny_dirs["draft"]), dtype="float32", device="cpu", progress=False)
    return target, draft


@pytest.fixture(scope="module")
def draft_server(tiny_dirs):
    """The tiny pair served in-process (method draft, k 3): (url, LLM, ServerState), one server per test module."""
    from server_utils import draft_llm, running_server

    from specdec import SpeculativeConfig

    llm = draft_llm(tiny_dirs)
    with running_server(llm, SpeculativeConfig(method="draft", num_speculative_tokens=3)) as (url, state):
        yield url, llm, state
