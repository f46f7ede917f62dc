"""The Qwen2/Llama decoder family: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.

The model knows nothing about requests, drafts or sampling: `forward(input_ids, positions, attn)` takes the new
tokens of every sequence in a step as one flat batch (a prefill chunk, a plain step, k+1 verification rows) with the
attention metadata the engine built (each sequence's cache, write positions and mask), and returns their hidden
states; `compute_logits(hidden)` applies the output head. Q/K/V and gate/up projections are fused into
one matmul each at load time (fewer, larger kernels: the CPU decode step is bound by weight reads).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .attn_metadata import AttnMetadata
from .kv_cache import SeqKV


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the reference implementation; bf16 variance loses too much.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(cfg: ModelConfig, max_positions: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables  # [max_positions, head_dim], fp32 (NeoX/HF half-split layout)."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64, device=device) / cfg.head_dim))
    t = torch.arange(max_positions, dtype=torch.float64, device=device)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [N, H, D]; cos/sin: [N, 1, D]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.split = (q_size, kv_size, kv_size)

    def forward(self, x: torch.Tensor, cos, sin, attn: AttnMetadata) -> torch.Tensor:
        # x: [N, hidden], the rows of every sequence in the step
        N = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = apply_rope(q.view(N, self.num_heads, self.head_dim), cos, sin)       # [N, Hq, D]
        k = apply_rope(k.view(N, self.num_kv_heads, self.head_dim), cos, sin)    # [N, Hkv, D]
        v = v.view(N, self.num_kv_heads, self.head_dim)
        outs = []
        for s in attn.seqs:     # each sequence attends to its own cache only: a row never depends on its neighbours
            rows = slice(s.query_start, s.query_start + s.num_tokens)
            k_cache, v_cache = s.kv.layer(self.layer_idx)                        # [Hkv, capacity, D]
            k_cache[:, s.start: s.start + s.num_tokens] = k[rows].transpose(0, 1)
            v_cache[:, s.start: s.start + s.num_tokens] = v[rows].transpose(0, 1)
            q_s = q[rows].transpose(0, 1)                                        # [Hq, T, D]
            if s.mask is not None and s.mask.shape[0] > s.num_tokens:   # padded queries: see causal_metadata
                q_s = torch.cat([q_s, q_s.new_zeros(self.num_heads, s.mask.shape[0] - s.num_tokens, self.head_dim)], 1)
            out = F.scaled_dot_product_attention(q_s[None], k_cache[None, :, : s.key_len],
                                                 v_cache[None, :, : s.key_len], attn_mask=s.mask, enable_gqa=True)
            outs.append(out[0, :, : s.num_tokens].transpose(0, 1).reshape(s.num_tokens, -1))   # [T, Hq*D]
        return self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, attn):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._rope_len = 0
        # Batch-invariant decoding (set by pack_for_cpu): attention runs over at least `min_query_rows`
        # query rows (zero-padded) and over keys padded with masked entries to a multiple of
        # `key_block`, so a one-token step and a (k+1)-token verification forward take the same kernel
        # paths and give bit-identical logits per row (measured on oneDNN / CPU flash attention).
        self.min_query_rows = 1
        self.key_block = 1

    def _rope(self, positions: torch.Tensor):
        needed = int(positions.max()) + 1
        if needed > self._rope_len:  # grow in powers of two; rebuilt rarely
            size = max(4096, 1 << (needed - 1).bit_length())
            self._cos, self._sin = rope_tables(self.config, size, positions.device)
            self._rope_len = size
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)  # [N, 1, D]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttnMetadata) -> torch.Tensor:
        """input_ids, positions: [N] (the new tokens of every sequence, flat) -> hidden [N, hidden].

        Writes each sequence's new K/V at the cache positions `attn` gives; never changes a cache's length.
        """
        cos, sin = self._rope(positions)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, attn)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> logits [..., vocab] in fp32."""
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()

    def pack_for_cpu(self) -> None:
        """Pre-pack linear weights for oneDNN (CPU only; a no-op elsewhere). Tied heads get their own copy."""
        from .quantization import quantize_model

        quantize_model(self, "none")

    def quantize_int8(self) -> None:
        """Weight-only int8 for every linear, the output head included (CPU)."""
        from .quantization import quantize_model

        quantize_model(self, "int8")

    def weight_nbytes(self) -> int:
        """Bytes of weights held, packed and int8 linears included."""
        packed = sum(m.nbytes for m in self.modules() if isinstance(getattr(m, "nbytes", None), int))
        return packed + sum(p.nbytes for p in self.parameters())

    def new_kv(self) -> SeqKV:
        """An empty cache for one sequence (grown by the caller as the sequence grows)."""
        p, c = self.embed_tokens.weight, self.config
        return SeqKV(c.num_layers, c.num_kv_heads, c.head_dim, p.dtype, p.device)
