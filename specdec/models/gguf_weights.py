"""GGUF files: the config from metadata, and dequantized tensors under Hugging Face names."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import SpecDecError
from ..gguf_file import field
from .config import ModelConfig
from .families import GGUF_ARCHS

SUPPORTED_ARCHS = GGUF_ARCHS

# GGUF block names -> Hugging Face names (per layer: blk.N.<key>).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Qwen3's block adds q/k norms; Gemma 3's has them too, four norms, and its ffn_norm is the pre-feed-forward one.
_QWEN3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_GEMMA3_LAYER_NAMES = {
    **_QWEN3_LAYER_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def gguf_config(reader) -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise SpecDecError(f"unsupported GGUF architecture '{arch}' (supported: {', '.join(SUPPORTED_ARCHS)})")
    names = {t.name for t in reader.tensors}
    hidden = int(field(reader, f"{arch}.embedding_length"))
    num_heads = int(field(reader, f"{arch}.attention.head_count"))
    head_dim = int(field(reader, f"{arch}.attention.key_length", hidden // num_heads))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return ModelConfig(
        arch=arch,
        vocab_size=int(embd.shape[1]) if tokens is None else max(int(embd.shape[1]), len(tokens.data)),
        hidden_size=hidden,
        intermediate_size=int(field(reader, f"{arch}.feed_forward_length")),
        num_layers=int(field(reader, f"{arch}.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(field(reader, f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(field(reader, f"{arch}.context_length", 4096)),
        attention_bias="blk.0.attn_q.bias" in names,
        tie_word_embeddings="output.weight" not in names,
        **(_gemma3_extra(reader, hidden, num_heads) if arch == "gemma3"
           else _decoder_extra(reader, arch, names, head_dim)),
    )


def _decoder_extra(reader, arch: str, names: set[str], head_dim: int) -> dict:
    """RoPE scaling and Qwen3's q/k norms of a qwen2/qwen3/llama file, and a refusal (one line) for what llama.cpp's
    header can say that specdec does not compute: a partial rotary dimension, a sliding window, YaRN.

    A Llama 3.x file carries its `llama3` scaling as the `rope_freqs` tensor (llama.cpp's converter computes the
    per-dimension divisors from the config's factors); `rope.scaling.type` linear carries a factor."""
    rot = field(reader, f"{arch}.rope.dimension_count")
    if rot is not None and int(rot) != head_dim:
        raise SpecDecError(f"GGUF {arch}.rope.dimension_count {rot} (RoPE over part of a {head_dim}-wide head) is not "
                           "supported")
    window = field(reader, f"{arch}.attention.sliding_window")
    if window:
        raise SpecDecError(f"GGUF {arch}.attention.sliding_window {window} is not supported")
    kind = field(reader, f"{arch}.rope.scaling.type")
    scaling = None
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(field(reader, f"{arch}.rope.scaling.factor"))}
    elif kind not in (None, "none"):
        raise SpecDecError(f"GGUF {arch}.rope.scaling.type '{kind}' is not supported (supported: none, linear)")
    if "rope_freqs.weight" in names:
        if scaling is not None:
            raise SpecDecError("GGUF rope_freqs beside a rope.scaling.type is not supported")
        factors = dequantize(next(t for t in reader.tensors if t.name == "rope_freqs.weight")).reshape(-1)
        if factors.shape[0] != head_dim // 2:
            raise SpecDecError(f"GGUF rope_freqs has {factors.shape[0]} factors, the head {head_dim // 2} frequencies")
        scaling = {"rope_type": "freq_factors", "factors": [float(x) for x in factors]}
    return dict(rope_scaling=scaling, qk_norm=arch == "qwen3")


def _gemma3_extra(reader, hidden: int, num_heads: int) -> dict:
    # Not in the file, hard-coded by llama.cpp as by HF's config: the pattern of 6 and the local base of 10k;
    # the attention scale is head_dim^-0.5 except for the 27B (62 layers), which scales by (hidden / heads)^-0.5.
    head_dim = int(field(reader, "gemma3.attention.key_length", 256))
    if field(reader, "gemma3.final_logit_softcapping") or field(reader, "gemma3.attn_logit_softcapping"):
        raise SpecDecError("Gemma 3 with logit soft-capping is not supported")
    scaling = field(reader, "gemma3.rope.scaling.type")
    if scaling not in (None, "none"):
        raise SpecDecError(f"Gemma 3 with RoPE scaling '{scaling}' is not supported")
    return dict(
        sliding_window=int(field(reader, "gemma3.attention.sliding_window", 512)),
        sliding_window_pattern=6,
        rope_local_theta=10000.0,
        query_pre_attn_scalar=float(hidden // num_heads if int(field(reader, "gemma3.block_count")) == 62
                                    else head_dim),
    )


def _unpermute_llama(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's converter interleaves the two RoPE halves of Q/K rows for llama-arch files;
    # undo it so the HF half-split RoPE applies.
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(tensor) -> np.ndarray:
    """One GGUF tensor -> float32 array in PyTorch's [out, in] layout."""
    from .quantization.gguf_blocks import tensor_floats

    return tensor_floats(tensor)


def iter_hf_tensors(reader, cfg: ModelConfig) -> Iterator[tuple[str, object]]:
    """Yield (hf_name, lazy tensor handle) for every tensor we use; callers dequantize."""
    names = {"gemma3": _GEMMA3_LAYER_NAMES, "qwen3": _QWEN3_LAYER_NAMES}.get(cfg.arch, _LAYER_NAMES)
    for t in reader.tensors:
        if t.name in _GLOBAL_NAMES:
            yield _GLOBAL_NAMES[t.name], t
            continue
        parts = t.name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in names:
            yield f"model.layers.{parts[1]}.{names[parts[2]]}", t
        elif t.name != "rope_freqs.weight":        # read into the config (gguf_config)
            # a tensor this family's forward would not read changes the arithmetic: refused, never dropped
            raise SpecDecError(f"GGUF tensor '{t.name}' is not computed by specdec's {cfg.arch} forward")


def llama_row_order(name: str, rows: int, cfg: ModelConfig) -> np.ndarray | None:
    """For a llama-arch file's Q or K weight or bias: the file's row of each HF row (None: rows already in HF's
    order)."""
    if cfg.arch != "llama" or not name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
        return None
    return _unpermute_llama(np.arange(rows), cfg.num_heads if ".q_proj." in name else cfg.num_kv_heads)


def dequantize_hf(name: str, tensor, cfg: ModelConfig) -> np.ndarray:
    w = dequantize(tensor)
    order = llama_row_order(name, w.shape[0], cfg)
    return w if order is None else w[order]
