"""The model families specdec computes, in one table: what `specdec models` prints and the README lists (a test keeps
the README's copy equal to `markdown_table()`), and what the config readers accept (HF `model_type`s, GGUF
architectures, RoPE types)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]      # HF config.json `model_type`
    gguf_archs: tuple[str, ...]       # GGUF `general.architecture`
    rope: str                         # RoPE types computed
    notes: str                        # what else it computes, and what is refused


FAMILIES = (
    Family("Qwen2 / Qwen2.5", ("qwen2",), ("qwen2",), "default, linear, llama3, yarn (HF); default, linear (GGUF)",
           "q/k/v biases; Qwen's own sliding window (use_sliding_window) refused"),
    Family("Qwen3 (dense)", ("qwen3",), ("qwen3",), "default, linear, llama3, yarn (HF); default, linear (GGUF)",
           "RMSNorm over each q and k head before RoPE, head_dim from the config"),
    Family("Llama 2 / 3.x", ("llama",), ("llama",),
           "default, linear, llama3, yarn (HF); default, linear, llama3 as rope_freqs (GGUF)",
           "tied or separate output head; attention_bias and mlp_bias refused"),
    Family("Mistral", ("mistral",), ("llama",), "default, linear, llama3, yarn (HF)",
           "sliding window on every layer (HF); a GGUF sliding_window key refused"),
    Family("Gemma 3 (text)", ("gemma3_text", "gemma3"), ("gemma3",), "default",
           "local/global layers (window, two RoPE bases), q/k norms, 4 norms a block; soft-capping refused"),
)
HF_MODEL_TYPES = tuple(t for f in FAMILIES for t in f.model_types)
GGUF_ARCHS = tuple(dict.fromkeys(a for f in FAMILIES for a in f.gguf_archs))
REFUSED = ("RoPE types dynamic, longrope and any other; partial rotary dimensions; YaRN in a GGUF; activations "
           "other than silu (gelu-tanh for Gemma 3); logit soft-capping outside Gemma; any weight tensor the family's "
           "forward does not read")


def markdown_table() -> str:
    rows = ["| family | HF model_type | GGUF architecture | RoPE | also |", "|---|---|---|---|---|"]
    rows += [f"| {f.name} | {', '.join(f.model_types)} | {', '.join(f.gguf_archs)} | {f.rope} | {f.notes} |"
             for f in FAMILIES]
    return "\n".join(rows) + f"\n\nRefused at load, with one line naming it: {REFUSED}."
