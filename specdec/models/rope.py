"""RoPE frequencies and their scalings, as transformers and llama.cpp compute them for the Llama/Qwen families.

A scaling is one dict on the config (`ModelConfig.rope_scaling`), read from an HF config's `rope_scaling` (or
transformers 5's `rope_parameters`) or from a GGUF header; every scaling changes the rotary frequencies only (and
YaRN the magnitude of cos/sin), so the tables are built once and the rotary op is the same:
- `linear`: every frequency divided by `factor`;
- `llama3` (Llama 3.1-3.3): long wavelengths divided by `factor`, short ones kept, a smooth ramp between, bounded
  by `original_max_position_embeddings / low_freq_factor` and `/ high_freq_factor`;
- `yarn`: interpolation and extrapolation blended per dimension by a ramp over `beta_fast` / `beta_slow`, cos/sin
  multiplied by `attention_factor` (0.1 ln(factor) + 1 unless given);
- `freq_factors`: each frequency divided by a per-dimension factor, the `rope_freqs` tensor llama.cpp's converter
  writes into a Llama 3 GGUF in place of the `llama3` parameters (the same numbers, precomputed).
Anything else (`dynamic`, whose frequencies change with the sequence's length; `longrope`; a partial rotary
dimension) is refused when the config is read (`check_rope_scaling`): a model computed with the wrong frequencies
gives fluent, wrong text.
"""
from __future__ import annotations

import math

import torch

ROPE_TYPES = ("default", "linear", "llama3", "yarn")   # what an HF config may name (freq_factors: GGUF only)
_REQUIRED = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings")}
_KNOWN_KEYS = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "truncate",
               "partial_rotary_factor", "mscale", "mscale_all_dim"}


def check_rope_scaling(params: dict | None, max_position_embeddings: int) -> dict | None:
    """An HF config's rope scaling -> the normalised dict `rope_frequencies` reads (None: plain RoPE), or a
    ValueError naming what specdec does not compute."""
    if not params:
        return None
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type '{kind}' is not supported (supported: {', '.join(ROPE_TYPES)})")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"partial_rotary_factor {params['partial_rotary_factor']} is not supported (RoPE over the "
                         "whole head only)")
    unknown = sorted(set(params) - _KNOWN_KEYS)
    if unknown:
        raise ValueError(f"rope parameter '{unknown[0]}' is not supported")
    if kind == "default":
        return None
    if kind == "yarn" and (params.get("mscale") or params.get("mscale_all_dim")):
        raise ValueError("yarn with mscale / mscale_all_dim is not supported")
    missing = [k for k in _REQUIRED[kind] if params.get(k) is None and not (
        k == "original_max_position_embeddings" and kind == "llama3")]
    if missing:
        raise ValueError(f"rope_type '{kind}' needs '{missing[0]}'")
    out = {"rope_type": kind, "factor": float(params["factor"])}
    if kind == "llama3":
        out.update(low_freq_factor=float(params["low_freq_factor"]), high_freq_factor=float(params["high_freq_factor"]),
                   original_max_position_embeddings=int(params.get("original_max_position_embeddings")
                                                        or max_position_embeddings))
    elif kind == "yarn":
        factor = out["factor"]
        attention = params.get("attention_factor")
        out.update(original_max_position_embeddings=int(params["original_max_position_embeddings"]),
                   beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                   attention_factor=float(attention) if attention is not None else
                   (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0),
                   truncate=bool(params.get("truncate", True)))
    return out


def rope_frequencies(head_dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] in float64, the factor cos/sin are multiplied by)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("rope_type")
    if kind is None:
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "freq_factors":
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float64), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling), scaling["attention_factor"]
    raise ValueError(f"rope_type '{kind}' is not supported")


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], \
        s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def _yarn(dim: int, theta: float, s: dict) -> torch.Tensor:
    factor, old = s["factor"], s["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s["beta_fast"]), correction_dim(s["beta_slow"])
    if s["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                                  # as transformers: no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    base = theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation = 1 - ramp                           # the share of each dimension left as it was trained
    return (1.0 / (factor * base)) * (1 - extrapolation) + (1.0 / base) * extrapolation
