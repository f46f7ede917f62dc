"""int4 entries of the conversion cache: packed linears as plain tensors + their formats as metadata.

A linear `L` (e.g. `layers.3.mlp.gate_up_proj`) is stored as `L.qw`, `L.sc`, `L.mn`, `L.dm` (see
blocks.PackedBlocks) and the safetensors metadata entry `quant.L = "bits,group,sb"`; its bias, and
every non-linear tensor, stay as float tensors under their usual names.
"""
from __future__ import annotations

import torch

from .blocks import BlockCodes, PackedBlocks, pack, quantize_blocks, quantize_int4

LINEAR_SUFFIXES = ("qkv_proj.weight", "o_proj.weight", "gate_up_proj.weight", "down_proj.weight")
MLP_SUFFIXES = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")     # up_proj also ends gate_up_proj


def is_linear_weight(name: str) -> bool:
    return name == "lm_head.weight" or name.endswith(LINEAR_SUFFIXES)


def is_mlp_weight(name: str) -> bool:
    """An MLP linear's weight, unfused (a GGUF's gate / up / down) or fused (gate_up_proj)."""
    return name.endswith(MLP_SUFFIXES)


def to_int4_state(state: dict, mlp_bits: int = 4) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """{name: tensor or BlockCodes} -> (tensors to save, metadata). Float linear weights are quantized: to 4 bits,
    the MLP's to mlp_bits with a searched range where that is fewer (a draft's MLP at 3)."""
    tensors, meta = {}, {}
    for name in list(state):
        value = state.pop(name)
        if not is_linear_weight(name):
            tensors[name] = value
            continue
        if isinstance(value, BlockCodes):
            codes = value
        elif mlp_bits != 4 and is_mlp_weight(name):
            codes = quantize_blocks(value.float(), mlp_bits, search=True)
        else:
            codes = quantize_int4(value.float())
        packed = pack(codes)
        linear = name.removesuffix(".weight")
        for t in PackedBlocks.TENSORS:
            tensors[f"{linear}.{t}"] = getattr(packed, t)
        meta[f"quant.{linear}"] = packed.format()
    return tensors, meta


def split_int4_state(state: dict[str, torch.Tensor], meta: dict[str, str]) -> tuple[dict, dict[str, PackedBlocks]]:
    """The inverse at load time: (float state for load_state_dict, {linear name: PackedBlocks})."""
    packed = {}
    for key, fmt in (meta or {}).items():
        if key.startswith("quant."):
            linear = key.removeprefix("quant.")
            tensors = {t: state.pop(f"{linear}.{t}") for t in PackedBlocks.TENSORS}
            packed[linear] = PackedBlocks.from_tensors(tensors, fmt)
    return state, packed
