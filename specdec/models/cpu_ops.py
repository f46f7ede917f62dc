"""Steps of the decoder layer around its matmuls: residual add + RMSNorm, rotary embedding, ragged attention,
SiLU-and-multiply.

On CPU they run as one call each in specdec._C (csrc/ops.cpp) when the extension is installed: in eager
PyTorch they are ~40 small ops per layer, which cost a one-token decode step milliseconds of dispatch. On
other devices, or without the extension, the eager code below runs. Both compute every row on its own
(batch invariance) with the same fp32 arithmetic and roundings; they may differ in the last bit of a norm
(the sum of squares is accumulated in another order), so one model uses one of them throughout.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .attn_metadata import AttnMetadata
from .quantization.kernels import extension

_FUSED_DTYPES = (torch.bfloat16, torch.float32)


def _ops():
    """specdec._C when it has the fused ops, else None (bf16/fp32 models then run the eager code)."""
    ext = extension()
    return ext if ext is not None and hasattr(ext, "rms_norm") else None


def fused_available(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype in _FUSED_DTYPES and _ops() is not None


# The `impl` of silu_mul and ragged_attention: which compiled path runs (auto: the best this CPU has).
OPS_IMPLS = {"auto": 0, "scalar": 1, "avx512": 2, "avx2": 3, "avx512bf16": 4, "amx": 5}   # the last two: attention


def ops_paths() -> list[str]:
    """The compiled paths this CPU runs (scalar always), for tests and reports; [] without the extension."""
    ext = _ops()
    if ext is None:
        return []
    paths = []
    for name in ("scalar", "avx512", "avx2"):
        try:
            ext.ops_path(OPS_IMPLS[name])
        except RuntimeError:
            continue
        paths.append(name)
    return paths


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [N, hidden] -> (weight * norm(h), h) with h = x + residual (or x when residual is None).

    The residual is updated in place when given (the caller owns it: the running hidden state).
    """
    if fused and weight.dtype == x.dtype and fused_available(x):
        x = x.contiguous()
        out = _ops().rms_norm(x, weight, eps, residual)
        return out, (x if residual is None else residual)
    if residual is not None:
        residual.add_(x)
        x = residual
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype), x


def silu_mul(gate_up: torch.Tensor, fused: bool = True, impl: str = "auto") -> torch.Tensor:
    """gate_up: [N, 2I] (gate, then up) -> silu(gate) * up  # [N, I]"""
    if fused and fused_available(gate_up):
        return _ops().silu_mul(gate_up.contiguous(), OPS_IMPLS[impl])
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [N, H, D]; cos/sin: [N, 1, D] (NeoX/HF half-split layout)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def rope_qkv(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
             num_kv_heads: int, head_dim: int, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv: [N, (Hq + 2 Hkv) D], positions: [N], cos/sin tables [P, D] fp32 -> q [N, Hq, D], k, v [N, Hkv, D],
    q and k rotated (in place on qkv when fused)."""
    N = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    if fused and fused_available(qkv):
        qkv = qkv.contiguous()
        _ops().rope_(qkv, positions, cos, sin, num_heads, num_kv_heads, head_dim)
        q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
        return (q.view(N, num_heads, head_dim), k.view(N, num_kv_heads, head_dim),
                v.view(N, num_kv_heads, head_dim))
    q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)          # [N, 1, D]
    return (rotate(q.reshape(N, num_heads, head_dim), c, s), rotate(k.reshape(N, num_kv_heads, head_dim), c, s),
            v.reshape(N, num_kv_heads, head_dim))


def ragged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: AttnMetadata, layer: int,
                     fused: bool = True, impl: str = "auto", window: int | None = None,
                     positions: torch.Tensor | None = None) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] -> [N, Hq*D]: each sequence writes its new K/V into its cache and each run of
    its rows attends over its own keys only (a row never depends on its neighbours). The compiled version runs
    the same ATen attention kernel with the same arguments, looping in C++.

    window (a sliding-window layer; the eager code then needs positions [N]): a row at position p also drops the
    keys at cache slots <= p - W. Slots before a sequence's new tokens hold positions equal to their slot; a token
    tree's new slots hold its speculative ancestors, all within the window of any row of the tree (the tree is
    shorter than W), so one rule serves chains, chunks and trees. The compiled rows keep their batch invariance with
    a window (csrc/attention.cpp, RowKeys), and a row whose window holds all its keys has the bits it has without."""
    if fused and fused_available(q):
        lists = attn.per_seq_lists
        return _ops().ragged_attention(q, k, v, lists[0], lists[1], layer, *lists[2:], impl=OPS_IMPLS[impl],
                                       window=window or 0)
    num_heads, head_dim = q.shape[1], q.shape[2]
    out = q.new_empty(q.shape[0], num_heads * head_dim)
    for s in attn.seqs:
        rows = slice(s.query_start, s.query_start + s.num_tokens)
        k_cache, v_cache = s.kv.layer(layer)                                     # [Hkv, capacity, D]
        k_cache[:, s.start: s.start + s.num_tokens] = k[rows].transpose(0, 1)
        v_cache[:, s.start: s.start + s.num_tokens] = v[rows].transpose(0, 1)
        for run in s.runs:
            r0 = s.query_start + run.first
            padded = run.mask.shape[0] if run.mask is not None else run.num_rows   # see causal_metadata
            mask = run.mask
            if window is not None:
                keys = torch.arange(run.key_len, device=q.device)
                near = keys[None, :] > (positions[r0: r0 + run.num_rows, None] - window)   # [rows, key_len]
                if padded > run.num_rows:       # zero-padded queries (batch invariance): their outputs are dropped
                    near = torch.cat([near, near.new_ones(padded - run.num_rows, run.key_len)])
                mask = near if mask is None else mask & near
            q_s = q[r0: r0 + run.num_rows].transpose(0, 1)                       # [Hq, T, D]
            if padded > run.num_rows:
                q_s = torch.cat([q_s, q_s.new_zeros(num_heads, padded - run.num_rows, head_dim)], 1)
            o = F.scaled_dot_product_attention(q_s[None], k_cache[None, :, : run.key_len],
                                               v_cache[None, :, : run.key_len], attn_mask=mask, enable_gqa=True)
            out[r0: r0 + run.num_rows] = o[0, :, : run.num_rows].transpose(0, 1).reshape(run.num_rows, -1)
    return out
