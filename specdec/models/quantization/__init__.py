"""Linear methods chosen at load time, applied from outside the model class.

The model is built with plain `nn.Linear` modules (fused qkv_proj / gate_up_proj); `quantize_model`
swaps every linear (qkv, o, gate_up, down and the output head) for the scheme's method:

| scheme | method | weights per token (1.5B target) |
|---|---|---|
| none | bf16: specdec._C's bf16 kernel (else oneDNN-packed, rows padded); fp32: oneDNN (packed_linear.py) | 3.09 GB |
| int8 | `aten._weight_int8pack_mm`, per-channel symmetric scales (quant.py) | ~1.55 GB |
| int4 | specdec._C block kernel: 4-bit codes in 32-k groups with scale and offset (blocks.py) | ~1.0 GB |

int4 weights come pre-packed from the conversion cache (GGUF blocks kept without loss, see
gguf_blocks.py) or are quantized here from the float weights.
"""
from __future__ import annotations

import torch
from torch import nn

from ...errors import SpecDecError

SCHEMES = ("none", "int8", "int4")
_ALIASES = {None: "none", "none": "none", "bf16": "none", "int8": "int8", "int4": "int4"}


def resolve_scheme(name: str | None) -> str:
    if name not in _ALIASES:
        raise SpecDecError(f"unknown quantization '{name}' (choose from: {', '.join(SCHEMES)})")
    return _ALIASES[name]


def linear_names(model: nn.Module) -> list[str]:
    """Qualified names of the linears a scheme replaces (the output head included)."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def _untie_head(model: nn.Module) -> None:
    # A tied head (lm_head None, logits from the embedding) gets its own linear to quantize or pack.
    if getattr(model, "lm_head", None) is None:
        emb = model.embed_tokens.weight
        head = nn.Linear(emb.shape[1], emb.shape[0], bias=False, dtype=emb.dtype, device="meta")
        head.weight = nn.Parameter(emb.detach(), requires_grad=False)
        model.lm_head = head


def _replace(model: nn.Module, make) -> int:
    count = 0
    for name in linear_names(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        setattr(parent, child, make(name, old))
        count += 1
    return count


def _batch_invariant_attention(model: nn.Module) -> None:
    """For models whose linears give a row the same bits at any row count: pad attention to fixed query rows and key
    blocks (see Transformer.min_query_rows) and mark the model batch-invariant."""
    from ..packed_linear import KEY_BLOCK, MIN_ROWS

    model.min_query_rows, model.key_block, model.batch_invariant = MIN_ROWS, KEY_BLOCK, True


def quantize_model(model: nn.Module, scheme: str | None, packed: dict | None = None) -> int:
    """Swap the model's linears for `scheme`'s method in place (CPU); returns how many were swapped.

    packed: {linear name: PackedBlocks} for int4, e.g. from the conversion cache; linears not in it
    are quantized from their float weights.
    """
    scheme = resolve_scheme(scheme)
    device = model.embed_tokens.weight.device
    if scheme == "none":
        from ..packed_linear import can_pack, pack_linear

        if not can_pack(model.embed_tokens.weight):
            return 0   # nothing to pack off CPU
        _untie_head(model)
        n = _replace(model, lambda name, m: pack_linear(m.weight.data, None if m.bias is None else m.bias.data))
        # bf16 linears (oneDNN packed or ours) are batch-invariant; fp32 through oneDNN is not (its GEMMs round by row
        # count), so its prompt rows keep flash attention
        if model.embed_tokens.weight.dtype == torch.bfloat16:
            _batch_invariant_attention(model)
        return n
    if device.type != "cpu":
        raise SpecDecError(f"{scheme} weight-only quantization is available on CPU only")
    _untie_head(model)
    if scheme == "int8":
        from ..quant import Int8Linear

        return _replace(model, lambda name, m: Int8Linear(m.weight.data, None if m.bias is None else m.bias.data,
                                                          m.weight.dtype))
    from .blocks import pack, quantize_int4
    from .kernels import load_kernels
    from .linear import BlockQuantLinear

    load_kernels()   # fail before touching the model when the extension is missing
    packed = packed or {}

    def make(name, m):
        p = packed.get(name) or pack(quantize_int4(m.weight.data.float()))
        p.share_equal_scales()
        return BlockQuantLinear(p, None if m.bias is None else m.bias.data)

    n = _replace(model, make)
    # int4 blocks are batch-invariant whatever the activations' dtype (fp32 ones too: their prompt rows would
    # otherwise keep ATen's flash attention, whose rows round by query count on some CPUs, Intel with AMX)
    _batch_invariant_attention(model)
    return n
