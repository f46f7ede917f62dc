"""ModelConfig: the shape of a decoder of a supported family (Qwen2, Llama, Gemma 3), read from GGUF metadata or
config.json."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class ModelConfig:
    arch: str                    # "qwen2", "llama" or "gemma3"
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
    sliding_window_pattern: int = 1         # every Nth layer is global (Gemma 3: 6), the others local
    rope_local_theta: float | None = None   # local layers' RoPE base (Gemma 3: 10,000; global ones: rope_theta)
    query_pre_attn_scalar: float | None = None   # attention scale query_pre_attn_scalar^-0.5 (None: head_dim)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends over a sliding window (0-based; Gemma 3: all but 5, 11, 17, ...)."""
        return self.sliding_window is not None and (layer + 1) % self.sliding_window_pattern != 0

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per cached token at 2 bytes/element (bf16)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json_file(cls, path: Path) -> ModelConfig:
        data = json.loads(Path(path).read_text())
        # fields added later have defaults: an entry written before them reads as the model it was
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelConfig:
        arch = cfg.get("model_type", "llama")
        if arch == "gemma3" and "text_config" in cfg:   # the multimodal wrapper: its language model
            cfg = {**cfg["text_config"], "model_type": "gemma3_text"}
            arch = "gemma3_text"
        if arch not in ("qwen2", "llama", "gemma3_text"):
            raise ValueError(f"unsupported model_type '{arch}' (supported: qwen2, llama, gemma3_text)")
        num_heads = cfg["num_attention_heads"]
        gemma = arch == "gemma3_text"
        if gemma:
            arch = "gemma3"
            if cfg.get("final_logit_softcapping") or cfg.get("attn_logit_softcapping"):
                raise ValueError("Gemma 3 with logit soft-capping is not supported")
        extra = _gemma3_fields(cfg) if gemma else {}
        rope_theta = extra.pop("rope_theta") if gemma else float(
            cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads", num_heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rope_theta=rope_theta,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
            **extra,
        )


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
