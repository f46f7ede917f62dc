"""Tiny random models of the families people bring (Llama 3.x, Qwen3, Mistral), built with transformers' own classes
and written as HF directories and as GGUF files the way llama.cpp's converter writes them (its metadata keys, its
Q/K row order for llama-arch files, a Llama 3 file's `rope_freqs` tensor), with the tiny byte-level BPE tokenizer of
conftest."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from conftest import CHATML, make_tokenizer

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, attn_implementation="eager")


def make_family(directory: Path, family: str, seed: int = 0, **overrides):
    """(directory, the transformers model) of a random-init `family` model: llama (Llama 3.2-shaped, GQA, llama3
    RoPE scaling unless overridden), qwen3 (q/k norms, a head_dim other than hidden / heads), mistral."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    directory.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(directory)
    cfg = dict(BASE, vocab_size=vocab)      # every row a token the tokenizer has: the engine never emits others
    if family == "llama":
        cfg.update(rope_parameters={"rope_theta": 10000.0, **LLAMA3_ROPE}, tie_word_embeddings=True)
        config_cls, model_cls = LlamaConfig, LlamaForCausalLM
    elif family == "qwen3":
        cfg.update(head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
        config_cls, model_cls = Qwen3Config, Qwen3ForCausalLM
    elif family == "mistral":
        cfg.update(sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        config_cls, model_cls = MistralConfig, MistralForCausalLM
    else:
        raise ValueError(family)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**cfg))
    with torch.no_grad():     # larger-than-default weights (norms included) make greedy outputs less degenerate
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.2) if "norm" in name else p.normal_(0, 0.3 if p.dim() == 2 else 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    return directory, model.eval()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row order for llama-arch files (the two RoPE halves interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg) -> np.ndarray:
    """The `rope_freqs` tensor llama.cpp's converter writes for a Llama 3 config: each frequency's divisor."""
    rope = cfg.rope_parameters
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factor, low, high, old = (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                              rope["original_max_position_embeddings"])
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(directory: Path, model, path: Path, arch: str, extra: dict | None = None,
               extra_tensors: dict | None = None, q8: bool = False) -> Path:
    """An F32 GGUF of `model` (a transformers model saved in `directory`) with llama.cpp's names and keys for `arch`
    (llama: Q/K rows permuted, rope_freqs for a llama3 scaling; qwen3: q/k norms). extra: more header keys; q8: the
    layers' linears in Q8_0 blocks (quantized after the permutation, as llama.cpp does)."""
    import gguf
    from tokenizers import Tokenizer

    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_file_type(7 if q8 else 0)     # MOSTLY_Q8_0 / ALL_F32: what default_quantization reads
    for key, value in (extra or {}).items():
        (w.add_string if isinstance(value, str) else w.add_float32 if isinstance(value, float) else w.add_uint32)(
            key, value)
    tok = json.loads(Tokenizer.from_file(str(directory / "tokenizer.json")).to_str())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    tokens = [t for t, _ in vocab]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), cfg.vocab_size)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials or t.startswith("[PAD") else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    w.add_eos_token_id(specials["<|im_end|>"])
    w.add_chat_template(CHATML)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    if arch == "llama" and (cfg.rope_parameters or {}).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            t = sd.get(f"model.layers.{i}.{hf}.weight")
            if t is None:
                continue
            if arch == "llama" and hf == "self_attn.q_proj":
                t = _permute(t, cfg.num_attention_heads)
            elif arch == "llama" and hf == "self_attn.k_proj":
                t = _permute(t, cfg.num_key_value_heads)
            t = np.ascontiguousarray(t)
            if q8 and t.ndim == 2:
                w.add_tensor(f"blk.{i}.{gg}.weight", gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0),
                             raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                w.add_tensor(f"blk.{i}.{gg}.weight", t)
    for name, t in (extra_tensors or {}).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
