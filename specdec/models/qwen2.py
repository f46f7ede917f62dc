"""The Qwen2/Qwen3/Llama decoder family: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP (Qwen3: an RMSNorm over
each q and k head before RoPE).

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

from . import cpu_ops, fused_stack
from .attn_metadata import AttnMetadata
from .config import ModelConfig
from .kv_cache import SeqKV
from .rope import rope_frequencies


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> (normalised, residual): with a residual, it becomes residual + x (in place) first.
        Normalised in fp32 like the reference implementation (bf16 variance loses too much)."""
        return cpu_ops.rms_norm(x, self.weight, self.eps, residual)


def rope_tables(cfg: ModelConfig, max_positions: int, device=None,
                theta: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables  # [max_positions, head_dim], fp32 (NeoX/HF half-split layout); base `theta` (default: the
    config's rope_theta, with the config's scaling; another base, a Gemma local layer's, is never scaled)."""
    inv_freq, magnitude = rope_frequencies(cfg.head_dim, theta or cfg.rope_theta,
                                           cfg.rope_scaling if theta is None else None)
    t = torch.arange(max_positions, dtype=torch.float64, device=device)
    freqs = torch.outer(t, inv_freq.to(device))
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * magnitude).float(), (emb.sin() * magnitude).float()


class RopeCache:
    """cos/sin tables for a model's positions, grown in powers of two as sequences grow (rebuilt rarely)."""

    def __init__(self, cfg: ModelConfig, theta: float | None = None):
        self.cfg, self.theta, self.len = cfg, theta, 0

    def __call__(self, needed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        if needed > self.len:
            self.len = max(4096, 1 << (needed - 1).bit_length())
            self.cos, self.sin = rope_tables(self.cfg, self.len, device, self.theta)
        return self.cos, self.sin   # [P, D] each


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.window = cfg.sliding_window if cfg.is_sliding(layer_idx) else None   # Mistral's; None: every key

    def forward(self, x: torch.Tensor, positions, cos, sin, attn: AttnMetadata) -> torch.Tensor:
        # x: [N, hidden], the rows of every sequence in the step; cos/sin: [P, D] tables indexed by positions [N]
        qkv = self.qkv_proj(x)
        if self.qk_norm:
            qkv = norm_qk(qkv, self.q_norm, self.k_norm, self.num_heads, self.num_kv_heads, self.head_dim)
        q, k, v = cpu_ops.rope_qkv(qkv, positions, cos, sin, self.num_heads, self.num_kv_heads,
                                   self.head_dim)                               # [N, Hq, D], [N, Hkv, D] x 2
        out = cpu_ops.ragged_attention(q, k, v, attn, self.layer_idx, window=self.window, positions=positions)
        return self.o_proj(out)                                                 # [N, Hq*D] -> [N, hidden]



def norm_qk(qkv: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm, num_heads: int, num_kv_heads: int, head_dim: int,
            q_scale: float | None = None) -> torch.Tensor:
    """[N, (Hq + 2 Hkv) D] with each q and k head RMS-normalised (Qwen3, Gemma 3), q then multiplied by q_scale
    where given; v as it was."""
    n, q_size, kv_size = qkv.shape[0], num_heads * head_dim, num_kv_heads * head_dim
    q = q_norm(qkv[:, :q_size].reshape(n * num_heads, head_dim))[0]
    k = k_norm(qkv[:, q_size: q_size + kv_size].reshape(n * num_kv_heads, head_dim))[0]
    if q_scale is not None:
        q = q * q_scale
    return torch.cat([q.view(n, -1), k.view(n, -1), qkv[:, q_size + kv_size:]], dim=1)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(cpu_ops.silu_mul(self.gate_up_proj(x)))   # [N, 2I] -> [N, I] -> [N, hidden]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, residual, positions, cos, sin, attn):
        # x: this layer's input before the residual add (the previous layer's MLP output, or the embeddings
        # with residual None); returns (MLP output, residual): the adds are fused into the norms
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, positions, cos, sin, attn)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_cls: type[nn.Module] = DecoderLayer):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer_cls(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # [V'] the token of each output-head row where the head keeps only some of the vocabulary (a draft model's
        # head cut to the tokens a target emits: loader.load_model(output_ids=...)); None: row i is token i
        self.output_ids: torch.Tensor | None = None
        self.output_rows = None      # output_rows.OutputRows: the whole head's rows on demand where it was cut
        self._rope = RopeCache(cfg)
        # Batch-invariant decoding (set by quantization.quantize_model for bf16 on CPU): attention runs over at
        # least `min_query_rows` query rows (zero-padded) and over keys padded with masked entries to a multiple of
        # `key_block`, so a one-token step and a (k+1)-token verification forward take the same kernel
        # paths and give bit-identical logits per row (measured on oneDNN / CPU flash attention).
        self.min_query_rows = 1
        self.key_block = 1
        self.batch_invariant = False   # its linears give every row the same bits whatever the row count

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttnMetadata,
                aux_layers: tuple[int, ...] = ()):
        """input_ids, positions: [N] (the new tokens of every sequence, flat) -> hidden [N, hidden].

        Writes each sequence's new K/V at the cache positions `attn` gives; never changes a cache's length.
        aux_layers: also return {i: the input of layer i  # [N, hidden]} (num_layers: the final normed hidden),
        what a learned draft head reads, from this same forward.
        """
        tables = self.rope_tables(attn.max_position + 1, input_ids.device)
        x, residual = self.embed(input_ids), None
        stack = self.fused_stack()
        if stack is not None:
            x, residual, aux = fused_stack.run_stack(stack, x, positions, tables[0], attn, aux_layers)
        else:
            aux = {}
            for i, layer in enumerate(self.layers):
                if i in aux_layers:
                    aux[i] = x.clone() if residual is None else x + residual   # the norms add into residual in place
                x, residual = layer(x, residual, positions, *tables[i], attn)
        hidden = self.norm(x, residual)[0]
        if not aux_layers:
            return hidden
        if self.config.num_layers in aux_layers:
            aux[self.config.num_layers] = hidden
        return hidden, aux

    def fused_stack(self):
        """The layers as one compiled call (models/fused_stack.py), or None where the modules must run them. Built
        on first use and again whenever the layers' linears were replaced (quantization after loading)."""
        if not fused_stack.runs_stack():
            return None
        key = (len(self.layers), id(self.layers[0].self_attn.qkv_proj), id(self.layers[-1].mlp.down_proj))
        if getattr(self, "_stack_key", None) != key:
            self._stack = fused_stack.build_stack(self, DecoderLayer)
            self._stack_key = key
        return self._stack

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)          # [N] -> [N, hidden]

    def rope_tables(self, needed: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (cos, sin) tables covering positions < needed (one RoPE base here: the same pair)."""
        return [self._rope(needed, device)] * len(self.layers)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] -> logits [..., vocab] in fp32."""
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()

    def weight_nbytes(self) -> int:
        """Bytes of weights held, packed and int8 linears included."""
        packed = sum(m.nbytes for m in self.modules() if isinstance(getattr(m, "nbytes", None), int))
        return packed + sum(p.nbytes for p in self.parameters())

    def new_kv(self) -> SeqKV:
        """An empty cache for one sequence (grown by the caller as the sequence grows)."""
        p, c = self.embed_tokens.weight, self.config
        return SeqKV(c.num_layers, c.num_kv_heads, c.head_dim, p.dtype, p.device)
