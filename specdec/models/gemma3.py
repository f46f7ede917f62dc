"""The Gemma 3 decoder (text): the Qwen2 layout with Gemma's differences.

- five of every six layers attend over a sliding window (`ModelConfig.is_sliding`), with their own RoPE base
  (`rope_local_theta`, 10k); the global ones use `rope_theta` (1M);
- per-head RMSNorm on q and k before RoPE; attention scale `query_pre_attn_scalar^-0.5`;
- four norms a layer: input -> attention -> post-attention norm -> + residual -> pre-feed-forward norm -> MLP ->
  post-feed-forward norm -> + residual;
- a gelu-tanh gated MLP; embeddings scaled by sqrt(hidden) (rounded to the weights' dtype, as HF does); the
  output head tied to the embeddings.

Norm weights are the ones the model multiplies by: a GGUF stores them so (llama.cpp's converter added Gemma's
`1 +`), and the loader adds the 1 to an HF checkpoint's.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import cpu_ops
from .attn_metadata import AttnMetadata
from .config import ModelConfig
from .kv_cache import SeqKV, WindowedKV
from .qwen2 import MLP, RMSNorm, RopeCache, Transformer, norm_qk


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.window = cfg.sliding_window if cfg.is_sliding(layer_idx) else None
        # its index among the layers of its kind, in a WindowedKV's global or local tensors
        self.cache_index = sum(cfg.is_sliding(i) == bool(self.window) for i in range(layer_idx))
        # the attention kernels scale by head_dim^-0.5; a model that wants another scale gets q pre-multiplied
        scalar = cfg.query_pre_attn_scalar or cfg.head_dim
        self.q_scale = None if scalar == cfg.head_dim else math.sqrt(cfg.head_dim / scalar)

    def forward(self, x: torch.Tensor, positions, cos, sin, attn: AttnMetadata) -> torch.Tensor:
        qkv = norm_qk(self.qkv_proj(x), self.q_norm, self.k_norm, self.num_heads, self.num_kv_heads, self.head_dim,
                      self.q_scale)                                              # [N, (Hq + 2 Hkv) D]
        q, k, v = cpu_ops.rope_qkv(qkv, positions, cos, sin, self.num_heads, self.num_kv_heads, self.head_dim)
        if attn.local is None:                     # a whole-model cache (SeqKV): every layer at its own index
            out = cpu_ops.ragged_attention(q, k, v, attn, self.layer_idx, window=self.window, positions=positions)
        else:                                      # a WindowedKV: the local layers read their span
            out = cpu_ops.ragged_attention(q, k, v, attn.local if self.window else attn, self.cache_index,
                                           window=self.window, positions=positions)
        return self.o_proj(out)                                                  # [N, Hq*D] -> [N, hidden]


class GeluMLP(MLP):
    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)                          # [N, I] each
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = Gemma3Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = GeluMLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)

    def forward(self, x, residual, positions, cos, sin, attn):
        # as Qwen2's layer: x is the previous layer's (normed) output before its residual add
        h, residual = self.input_layernorm(x, residual)
        h = self.post_attention_layernorm(self.self_attn(h, positions, cos, sin, attn))[0]
        h, residual = self.pre_feedforward_layernorm(h, residual)
        return self.post_feedforward_layernorm(self.mlp(h))[0], residual


class Gemma3Transformer(Transformer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, Gemma3DecoderLayer)
        self._local_rope = RopeCache(cfg, cfg.rope_local_theta)
        self.embed_scale = math.sqrt(cfg.hidden_size)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        w = self.embed_tokens.weight
        return self.embed_tokens(input_ids) * torch.tensor(self.embed_scale, dtype=w.dtype, device=w.device)

    def new_kv(self) -> SeqKV:
        """A WindowedKV where the compiled attention runs (its local layers keep a span of recent positions);
        elsewhere every layer's whole history (the eager attention masks the window)."""
        p, c = self.embed_tokens.weight, self.config
        if not cpu_ops.fused_available(p):
            return super().new_kv()
        sliding = [c.is_sliding(i) for i in range(c.num_layers)]
        return WindowedKV(sliding, c.sliding_window, max(1, self.key_block), c.num_kv_heads, c.head_dim, p.dtype,
                          p.device)

    def rope_tables(self, needed: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        full, local = self._rope(needed, device), self._local_rope(needed, device)
        return [local if self.config.is_sliding(i) else full for i in range(len(self.layers))]
