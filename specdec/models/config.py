"""ModelConfig: the shape of a decoder of a supported family (Qwen2, Qwen3, Llama, Mistral, Gemma 3), read from
GGUF metadata or config.json.

Every field of a config that changes the arithmetic is read here or refused with a ValueError naming it: a model
computed without its RoPE scaling, a bias or a window gives fluent, wrong text, so nothing is ignored in silence.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .families import HF_MODEL_TYPES
from .rope import check_rope_scaling


@dataclass
class ModelConfig:
    arch: str                    # "qwen2", "qwen3", "llama" (Mistral too) or "gemma3"
    vocab_size: int              # rows of the embedding / output head
    hidden_size: int
    intermediate_size: int       # SwiGLU inner width
    num_layers: int
    num_heads: int               # query heads
    num_kv_heads: int            # key/value heads (grouped-query attention)
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    attention_bias: bool         # Qwen2 has biases on q/k/v projections
    tie_word_embeddings: bool    # output head shares the embedding matrix
    # Gemma 3 (defaults: every layer global, one RoPE base, SwiGLU, scale head_dim^-0.5)
    sliding_window: int | None = None       # keys a local layer attends: a row at position p sees p-W+1 .. p
    sliding_window_pattern: int = 1         # every Nth layer is global (Gemma 3: 6), the others local; 0: none is
                                            # (Mistral: every layer attends over the window)
    rope_local_theta: float | None = None   # local layers' RoPE base (Gemma 3: 10,000; global ones: rope_theta)
    query_pre_attn_scalar: float | None = None   # attention scale query_pre_attn_scalar^-0.5 (None: head_dim)
    rope_scaling: dict | None = None        # rope.check_rope_scaling's dict (llama3, linear, yarn, freq_factors)
    qk_norm: bool = False                   # Qwen3: RMSNorm over each q and k head before RoPE

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends over a sliding window (0-based; Gemma 3: all but 5, 11, 17, ...)."""
        return self.sliding_window is not None and (self.sliding_window_pattern == 0
                                                    or (layer + 1) % self.sliding_window_pattern != 0)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per cached token at 2 bytes/element (bf16)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json_file(cls, path: Path) -> ModelConfig:
        data = json.loads(Path(path).read_text())
        if data.get("arch") == "llama" and "rope_scaling" not in data:
            # written before RoPE scaling was read: a Llama 3 entry would run without it (the loader converts again)
            raise ValueError("a Llama entry converted before RoPE scaling was read")
        # fields added later have defaults: an entry written before them reads as the model it was
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelConfig:
        arch = cfg.get("model_type", "llama")
        if arch == "gemma3":                            # the multimodal wrapper: its language model
            cfg = {**cfg.get("text_config", cfg), "model_type": "gemma3_text"}
            arch = "gemma3_text"
        if arch not in HF_MODEL_TYPES:
            raise ValueError(f"unsupported model_type '{arch}' (supported: {', '.join(HF_MODEL_TYPES)})")
        num_heads = cfg["num_attention_heads"]
        gemma = arch == "gemma3_text"
        if gemma:
            arch = "gemma3"
            if cfg.get("final_logit_softcapping") or cfg.get("attn_logit_softcapping"):
                raise ValueError("Gemma 3 with logit soft-capping is not supported")
        else:
            _refuse_unread(cfg, arch)
        extra = _gemma3_fields(cfg) if gemma else _decoder_fields(cfg, arch)
        rope_theta = extra.pop("rope_theta")
        return cls(
            arch={"mistral": "llama"}.get(arch, arch),
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rope_theta=rope_theta,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
            **extra,
        )


def _refuse_unread(cfg: dict, arch: str) -> None:
    """The fields of a Qwen2/Qwen3/Llama/Mistral config that change the arithmetic and that specdec does not
    compute: a ValueError naming the first one present."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act '{cfg['hidden_act']}' is not supported (SwiGLU with silu only)")
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias is not supported")
    if arch in ("llama", "mistral", "qwen3") and cfg.get("attention_bias"):
        # Llama's attention_bias puts a bias on o_proj too; Qwen2's q/k/v biases are the only ones computed
        raise ValueError(f"attention_bias on a {arch} model is not supported")
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "logits_scaling", "embedding_multiplier",
                "residual_multiplier", "attention_multiplier", "pretraining_tp"):
        if cfg.get(key) not in (None, 0, 1, 1.0):
            raise ValueError(f"{key} {cfg[key]} is not supported")
    # Qwen's window (use_sliding_window, on the layers past max_window_layers) is not computed; Mistral's is
    # (_decoder_fields)
    if arch != "mistral" and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        raise ValueError(f"sliding_window {cfg['sliding_window']} on a {arch} model is not supported")
    allowed = {"full_attention", "sliding_attention"} if arch == "mistral" else {"full_attention"}
    types = set(cfg.get("layer_types") or ()) - allowed
    if types:
        raise ValueError(f"layer_types {sorted(types)} on a {arch} model are not supported")


def _decoder_fields(cfg: dict, arch: str) -> dict:
    """RoPE base and scaling (transformers 4's rope_theta / rope_scaling, or 5's rope_parameters) and Qwen3's q/k
    norms of a Qwen2/Qwen3/Llama/Mistral config."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    positions = cfg.get("max_position_embeddings", 4096)
    out = dict(rope_theta=theta, rope_scaling=check_rope_scaling(params, positions), qk_norm=arch == "qwen3")
    window = cfg.get("sliding_window")
    if arch == "mistral" and window and window < positions:
        # every layer attends over the last `window` positions (a window as long as the positions drops nothing)
        out.update(sliding_window=int(window), sliding_window_pattern=0)
    return out


def _gemma3_fields(cfg: dict) -> dict:
    """Gemma 3's extra fields from an HF config: old keys (rope_theta, rope_local_base_freq, sliding_window_pattern)
    or transformers 5's (rope_parameters per attention kind, layer_types)."""
    ropes = cfg.get("rope_parameters") or {}
    full, local = ropes.get("full_attention") or {}, ropes.get("sliding_attention") or {}
    for kind in (full, local, cfg.get("rope_scaling") or {}):
        if kind.get("rope_type", "default") not in ("default", None):
            raise ValueError(f"Gemma 3 with rope_type '{kind['rope_type']}' is not supported")
    pattern = int(cfg.get("sliding_window_pattern") or 6)
    types = cfg.get("layer_types")
    if types:
        pattern = types.index("full_attention") + 1 if "full_attention" in types else len(types) + 1
        if types != ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(len(types))]:
            raise ValueError("Gemma 3 layer_types that do not repeat one pattern are not supported")
    return dict(
        rope_theta=float(full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
        sliding_window=int(cfg.get("sliding_window") or 512),
        sliding_window_pattern=pattern,
        rope_local_theta=float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0))),
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or cfg.get("head_dim") or 256),
    )
