"""The decoder layers as one compiled call per forward (csrc/stack.cpp), where a model's layers are exactly what it
runs: Qwen2 / Llama / Mistral layers whose four linears are int4 blocks (BlockQuantLinear) on CPU with the fused ops.

The compiled loop makes the calls the modules make, in their order and with their arguments, so the rows get the
same bits (tests/test_fused_stack.py); it only drops the Python around them, which a one-token step of a small model
pays for in every layer. Anything else -- Qwen3's q/k norms, Gemma's layers, bf16 or int8 linears, a kernel forced by
a test (`BlockQuantLinear.impl`) -- keeps the modules.
"""
from __future__ import annotations

import torch

from . import cpu_ops
from .quantization.kernels import extension
from .quantization.linear import BlockQuantLinear


def build_stack(model, layer_cls: type):
    """A specdec._C.DecoderStack over `model.layers`, or None where some layer is not exactly `layer_cls` (the
    Qwen2 decoder layer, whose calls the stack makes) or not of the kind it runs."""
    ext = extension()
    cfg = model.config
    weight = model.embed_tokens.weight
    if ext is None or not hasattr(ext, "DecoderStack") or not cpu_ops.fused_available(weight) or cfg.qk_norm:
        return None
    stack = ext.DecoderStack(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
    for layer in model.layers:
        if type(layer) is not layer_cls:
            return None
        attn, mlp = layer.self_attn, layer.mlp
        linears = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        if (not all(type(m) is BlockQuantLinear for m in linears)
                or any(n.weight.dtype != weight.dtype or n.eps != cfg.rms_norm_eps for n in norms)):
            return None
        stack.add_layer(norms[0].weight.detach(), norms[1].weight.detach(), *map(_linear, linears),
                        window=attn.window or 0)
    return stack


def _linear(m: BlockQuantLinear):
    p = m.packed
    return extension().StackLinear(p.qw, p.sc, p.mn, p.dm, m.bias, p.bits, p.group, p.sb, m.out_features)


def runs_stack() -> bool:
    """Whether the compiled layers may run now: the kernels every module would pick (no test forcing another)."""
    return BlockQuantLinear.impl == "auto"


def run_stack(stack, x: torch.Tensor, positions: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor], attn,
              aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """(x, residual, {layer: its input}) after every layer, as Transformer.forward's loop leaves them."""
    wanted = sorted(i for i in aux_layers if i < len(stack))
    x, residual, aux = stack.forward(x, positions, *tables, *attn.per_seq_lists, wanted)
    return x, residual, dict(zip(wanted, aux))
