"""An EAGLE-3 draft head: one decoder layer that reads three of the target's hidden states and the token just
chosen, and predicts the next token over a reduced draft vocabulary.

Per row (position t): the target's hidden states at three layers are fused by `fc` (3H -> H) into g_t; the
layer's input is [input_layernorm(embed(x_{t+1})), hidden_norm(g_t)] (2H wide) for attention, with g_t as the
residual; its output h_t (before the final norm) predicts x_{t+2} through `norm` and `lm_head`, and is the g of the
next row when the head drafts on from its own guess (no target states exist there yet). The draft vocabulary maps
to the target's by `d2t` (target id = draft id + d2t[draft id]).

The weights load from the layout vLLM and SGLang read (`LlamaForCausalLMEagle3`: fc, midlayer.*, norm, lm_head,
d2t, t2d; the target's embedding when the head has none). Two forwards share them: `forward` for inference over
the engine's ragged batches and KV caches (the fused CPU ops), and `train_forward`, plain differentiable torch over
whole sequences with the training-time-test unrolling of the EAGLE-3 paper.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .attn_metadata import AttnMetadata
from .config import ModelConfig
from .kv_cache import SeqKV
from .qwen2 import MLP, Attention, RMSNorm, RopeCache, rope_tables


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs EAGLE-3 reads, as vLLM picks them: early, middle, late (clamped into a
    small test model's range)."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int                      # the target's vocabulary (t2d's length)
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 32768
    target_hidden_size: int = 0          # 0: hidden_size
    aux_layers: tuple[int, ...] = field(default_factory=tuple)
    norm_before_residual: bool = False   # some trained heads take hidden_norm(g) as the residual
    target: str = ""                     # what it was trained for (informational)

    def __post_init__(self):
        self.target_hidden_size = self.target_hidden_size or self.hidden_size
        self.aux_layers = tuple(self.aux_layers)

    def layer_config(self) -> ModelConfig:
        return ModelConfig("llama", self.draft_vocab_size, self.hidden_size, self.intermediate_size, 1,
                           self.num_heads, self.num_kv_heads, self.head_dim, self.rope_theta, self.rms_norm_eps,
                           self.max_position_embeddings, False, False)

    @classmethod
    def from_hf(cls, cfg: dict, target: ModelConfig) -> Eagle3Config:
        """config.json of an EAGLE-3 head (vLLM/SGLang's keys); aux layers default to vLLM's choice."""
        heads = cfg["num_attention_heads"]
        eagle = cfg.get("eagle_config") or {}
        aux = eagle.get("eagle_aux_hidden_state_layer_ids") or cfg.get("eagle_aux_hidden_state_layer_ids")
        return cls(hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"], num_heads=heads,
                   num_kv_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   vocab_size=cfg.get("vocab_size", target.vocab_size),
                   draft_vocab_size=cfg.get("draft_vocab_size") or cfg.get("vocab_size", target.vocab_size),
                   rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                   rope_theta=float(cfg.get("rope_theta", target.rope_theta)),
                   max_position_embeddings=cfg.get("max_position_embeddings", target.max_position_embeddings),
                   target_hidden_size=cfg.get("target_hidden_size") or cfg["hidden_size"],
                   aux_layers=tuple(aux) if aux else default_aux_layers(target.num_layers),
                   norm_before_residual=bool(cfg.get("norm_before_residual", False)),
                   target=cfg.get("specdec_target", ""))

    def to_hf(self) -> dict:
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "num_hidden_layers": 1, "vocab_size": self.vocab_size,
                "draft_vocab_size": self.draft_vocab_size, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position_embeddings,
                "target_hidden_size": self.target_hidden_size, "tie_word_embeddings": False,
                "hidden_act": "silu", "norm_before_residual": self.norm_before_residual,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers)},
                "specdec_target": self.target}


class Eagle3Head(nn.Module):
    method = "eagle3"         # the speculative method it drafts for (its declaration: proposers/eagle.py)
    key_block = 1                        # for the KV manager: the head's cache needs no padding

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.cfg = cfg
        lc = cfg.layer_config()
        self.layer_cfg = lc
        H = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.aux_layers) * cfg.target_hidden_size, H, bias=False)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = Attention(lc, 0)
        self.self_attn.qkv_proj = nn.Linear(2 * H, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(lc)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))     # target = draft + d2t
        self._rope = RopeCache(self.layer_cfg)

    @property
    def dtype(self) -> torch.dtype:
        return self.input_layernorm.weight.dtype      # norms keep the runtime dtype when linears are packed

    # -- vocabulary ---------------------------------------------------------------------------------------------
    @property
    def draft_to_target(self) -> torch.Tensor:
        """[draft_vocab] target token id of each draft token."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_vocab(self, target_ids: torch.Tensor) -> None:
        """The draft vocabulary: target_ids [draft_vocab], ascending target ids."""
        self.d2t.copy_(target_ids.to(self.d2t) - torch.arange(len(target_ids), device=self.d2t.device))

    def t2d(self) -> torch.Tensor:
        """[vocab] bool: which target tokens the head can propose."""
        mask = torch.zeros(self.cfg.vocab_size, dtype=torch.bool, device=self.d2t.device)
        mask[self.draft_to_target] = True
        return mask

    # -- inference ------------------------------------------------------------------------------------------------
    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's hidden states [N, 3 H_target] -> g [N, H]."""
        return self.fc(aux)

    @torch.inference_mode()
    def forward(self, embeds: torch.Tensor, g: torch.Tensor, positions: torch.Tensor,
                attn: AttnMetadata) -> torch.Tensor:
        """embeds [N, H] (the target's embedding of each row's token), g [N, H] -> h [N, H] before the final norm.
        Writes each row's K/V into its sequence's cache at the positions `attn` gives."""
        cos, sin = self._rope(attn.max_position + 1, g.device)
        e = self.input_layernorm(embeds)[0]
        gn = self.hidden_norm(g)[0]
        residual = (gn if self.cfg.norm_before_residual else g).clone()
        a = self.self_attn(torch.cat([e, gn], -1), positions, cos, sin, attn)
        h, residual = self.post_attention_layernorm(a, residual)
        return self.mlp(h) + residual

    @torch.inference_mode()
    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> draft-vocabulary logits [N, draft_vocab] fp32."""
        return self.lm_head(self.norm(h)[0]).float()

    def new_kv(self) -> SeqKV:
        w, c = self.input_layernorm.weight, self.cfg            # norms keep the runtime dtype when linears are packed
        return SeqKV(1, c.num_kv_heads, c.head_dim, w.dtype, w.device)

    def weight_nbytes(self) -> int:
        packed = sum(m.nbytes for m in self.modules() if isinstance(getattr(m, "nbytes", None), int))
        return packed + sum(p.nbytes for p in self.parameters()) + self.d2t.nbytes

    # -- training -------------------------------------------------------------------------------------------------
    def train_forward(self, embeds: torch.Tensor, g: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test over whole sequences, differentiable; plain torch.

        embeds: [B, T, H] embeddings of x_{t+1} per row t (step 0); the caller shifts them one further per step;
        here step j's embeddings are embeds[:, j:] padded by repeating the last row. g: [B, T, H] fused target
        states. Step j (0 <= j < steps) feeds row t the head's own output of step j-1 at row t (g at step 0) and
        x_{t+j+1}, at position t + j, attending to step 0's keys at rows <= t and its own rows t of steps 1..j
        (as at inference, where the head drafts on from its own guesses past the last verified row). Returns
        each step's draft logits [B, T, draft_vocab]; row t of step j predicts x_{t+j+2}."""
        c = self.cfg
        B, T, H = g.shape
        Hq, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        cos, sin = rope_tables(self.layer_cfg, T + steps, g.device)
        keys, values, outs = [], [], []
        causal = torch.ones(T, T, dtype=torch.bool, device=g.device).tril()
        w = self.self_attn.qkv_proj.weight
        for j in range(steps):
            e = embeds[:, j:]
            if j:
                e = torch.cat([e, e[:, -1:].expand(B, j, H)], 1)
            pos = torch.arange(j, T + j, device=g.device)
            en = _rms(e, self.input_layernorm.weight, c.rms_norm_eps)
            gn = _rms(g, self.hidden_norm.weight, c.rms_norm_eps)
            qkv = F.linear(torch.cat([en, gn], -1), w)
            q, k, v = qkv.split((Hq * D, Hkv * D, Hkv * D), -1)
            q = _rotate(q.view(B, T, Hq, D), cos[pos], sin[pos])
            k = _rotate(k.view(B, T, Hkv, D), cos[pos], sin[pos])
            v = v.view(B, T, Hkv, D)
            keys.append(k)
            values.append(v)
            rep = Hq // Hkv
            qh = q.transpose(1, 2)                                               # [B, Hq, T, D]
            k0 = keys[0].transpose(1, 2).repeat_interleave(rep, 1)
            v0 = values[0].transpose(1, 2).repeat_interleave(rep, 1)
            scores = [(qh @ k0.transpose(-1, -2)).masked_fill(~causal, float("-inf"))]   # [B, Hq, T, T]
            for ki in keys[1:]:                                                  # own rows of later steps
                scores.append((qh * ki.transpose(1, 2).repeat_interleave(rep, 1)).sum(-1, keepdim=True))
            p = torch.softmax(torch.cat(scores, -1).float() / D ** 0.5, -1).to(q.dtype)
            a = p[..., :T] @ v0
            for i, vi in enumerate(values[1:]):
                a = a + p[..., T + i: T + i + 1] * vi.transpose(1, 2).repeat_interleave(rep, 1)
            a = self.self_attn.o_proj(a.transpose(1, 2).reshape(B, T, Hq * D))
            residual = (gn if c.norm_before_residual else g) + a
            hn = _rms(residual, self.post_attention_layernorm.weight, c.rms_norm_eps)
            gate, up = F.linear(hn, self.mlp.gate_up_proj.weight).chunk(2, -1)
            h = self.mlp.down_proj(F.silu(gate) * up) + residual
            outs.append(self.lm_head(_rms(h, self.norm.weight, c.rms_norm_eps)))
            g = h
        return outs


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, T, H, D]; cos/sin [T, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x.float() * cos[:, None] + rotated.float() * sin[:, None]).to(x.dtype)
