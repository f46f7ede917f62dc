"""ModelConfig: the shape of a Qwen2/Llama-family decoder, read from GGUF metadata or config.json."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class ModelConfig:
    arch: str                    # "qwen2" or "llama"
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

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per cached token at 2 bytes/element (bf16)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json_file(cls, path: Path) -> ModelConfig:
        data = json.loads(Path(path).read_text())
        return cls(**{f.name: data[f.name] for f in fields(cls)})

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelConfig:
        arch = cfg.get("model_type", "llama")
        if arch not in ("qwen2", "llama"):
            raise ValueError(f"unsupported model_type '{arch}' (supported: qwen2, llama)")
        num_heads = cfg["num_attention_heads"]
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads", num_heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )
