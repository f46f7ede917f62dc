"""An EAGLE (EAGLE-1/2) draft head: the target's last hidden state and the embedding of the token after it, fused
by `fc`, through one (or a few) decoder layers; the output is a guess of the target's next hidden state, which the
target's own output head turns into logits over the full vocabulary.

Per row (position t): x_t = fc([embed(x_{t+1}), f_t]) with f_t the target's final normed hidden state at t; the
first layer has no input norm (the EAGLE reference skips it); the output h_t (no final norm) predicts x_{t+2}
through the target's output head, and is the f of the next row when the head drafts on from its own guess.

The weights load from the layout the EAGLE authors publish and vLLM reads (`fc.weight` [, `fc.bias`],
`layers.{i}.*`, optionally `embed_tokens.weight`, which is ignored: the target's embedding is used; HASS's
`embedding_layernorm` / `hidden_states_layernorm` when `add_para_norm` is set). It shares `forward` and its KV
cache with EAGLE-3 (`proposers/eagle.py`); it is loaded, not trained, here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .attn_metadata import AttnMetadata
from .config import ModelConfig
from .kv_cache import SeqKV
from .qwen2 import DecoderLayer, RMSNorm, RopeCache


@dataclass
class EagleConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int                      # the target's (logits come from the target's output head)
    target_layers: int                   # the target's layer count: its final normed state is what the head reads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    fc_bias: bool = False
    para_norm: bool = False              # HASS: RMS norms on the embedding and the feature before `fc`
    model_type: str = "llama"

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return (self.target_layers,)

    def layer_config(self) -> ModelConfig:
        return ModelConfig(self.model_type, self.vocab_size, self.hidden_size, self.intermediate_size,
                           self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim, self.rope_theta,
                           self.rms_norm_eps, self.max_position_embeddings, self.attention_bias, False)

    @classmethod
    def from_hf(cls, cfg: dict, target: ModelConfig, fc_bias: bool) -> EagleConfig:
        heads = cfg["num_attention_heads"]
        model_type = cfg.get("model_type", "llama") if cfg.get("model_type") in ("llama", "qwen2") else "llama"
        return cls(hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
                   num_layers=cfg.get("num_hidden_layers", 1), num_heads=heads,
                   num_kv_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   vocab_size=cfg.get("vocab_size", target.vocab_size), target_layers=target.num_layers,
                   rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(cfg.get("rope_theta", target.rope_theta)),
                   max_position_embeddings=cfg.get("max_position_embeddings", target.max_position_embeddings),
                   attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")), fc_bias=fc_bias,
                   para_norm=bool(cfg.get("add_para_norm", False)), model_type=model_type)

    def to_hf(self) -> dict:
        return {"architectures": ["EagleLlamaForCausalLM"], "model_type": self.model_type,
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim, "vocab_size": self.vocab_size,
                "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
                "max_position_embeddings": self.max_position_embeddings, "attention_bias": self.attention_bias,
                "add_para_norm": self.para_norm, "hidden_act": "silu"}


class EagleHead(nn.Module):
    method = "eagle"         # the speculative method it drafts for (its declaration: proposers/eagle.py)
    key_block = 1                        # for the KV manager: the head's cache needs no padding

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.cfg = cfg
        self.layer_cfg = cfg.layer_config()
        H = cfg.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=cfg.fc_bias)
        if cfg.para_norm:
            self.embedding_layernorm = RMSNorm(H, cfg.rms_norm_eps)
            self.hidden_states_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(self.layer_cfg, i) for i in range(cfg.num_layers))
        self.layers[0].input_layernorm = nn.Identity()          # the reference's first layer has no input norm
        self._rope = RopeCache(self.layer_cfg)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].post_attention_layernorm.weight.dtype

    @property
    def draft_to_target(self) -> torch.Tensor:
        """Every target token (the head drafts over the full vocabulary)."""
        return torch.arange(self.cfg.vocab_size, device=self.layers[0].post_attention_layernorm.weight.device)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's final normed hidden states [N, H] are the feature as they are."""
        return aux

    @torch.inference_mode()
    def forward(self, embeds: torch.Tensor, g: torch.Tensor, positions: torch.Tensor,
                attn: AttnMetadata) -> torch.Tensor:
        """embeds [N, H] (the target's embedding of each row's token), g [N, H] the feature -> h [N, H], the guess
        of the target's next feature. Writes each layer's K/V into the sequences' caches."""
        cos, sin = self._rope(attn.max_position + 1, g.device)
        if self.cfg.para_norm:
            embeds, g = self.embedding_layernorm(embeds)[0], self.hidden_states_layernorm(g)[0]
        x = self.fc(torch.cat([embeds, g.to(embeds.dtype)], -1))
        first = self.layers[0]
        residual = x.clone()
        h = first.self_attn(x, positions, cos, sin, attn)
        h, residual = first.post_attention_layernorm(h, residual)
        x = first.mlp(h)
        for layer in self.layers[1:]:
            x, residual = layer(x, residual, positions, cos, sin, attn)
        return x + residual

    def new_kv(self) -> SeqKV:
        c = self.cfg
        w = self.layers[0].post_attention_layernorm.weight
        return SeqKV(c.num_layers, c.num_kv_heads, c.head_dim, w.dtype, w.device)

    def weight_nbytes(self) -> int:
        packed = sum(m.nbytes for m in self.modules() if isinstance(getattr(m, "nbytes", None), int))
        return packed + sum(p.nbytes for p in self.parameters())
