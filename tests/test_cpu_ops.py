"""The compiled decoder-layer steps (csrc/ops.cpp, csrc/attention.cpp) against the eager code they replace:
rotary embedding and ragged attention bit-identical, the norm within an ulp and exact in its residual add,
every row independent of the rows beside it, and clear errors on bad input."""
from __future__ import annotations

import pytest
import torch

from specdec.models import cpu_ops
from specdec.models.attn_metadata import causal_metadata, tree_keys
from specdec.models.config import ModelConfig
from specdec.models.kv_cache import SeqKV
from specdec.models.qwen2 import rope_tables

ext = pytest.importorskip("specdec._C", reason="specdec._C not built (needs a C++ compiler at install)")

DTYPES = [torch.float32, torch.bfloat16]


def _rand(*shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def test_fused_ops_are_used_on_cpu():
    assert cpu_ops.fused_available(torch.zeros(1, dtype=torch.bfloat16))
    assert not cpu_ops.fused_available(torch.zeros(1, dtype=torch.float16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_eager(dtype):
    x, res = _rand(37, 896, dtype=dtype), _rand(37, 896, dtype=dtype, seed=1, scale=4)
    w = _rand(896, dtype=dtype, seed=2)
    res_fused, res_eager = res.clone(), res.clone()
    out_f, r_f = cpu_ops.rms_norm(x, w, 1e-6, res_fused)
    out_e, r_e = cpu_ops.rms_norm(x, w, 1e-6, res_eager, fused=False)
    assert r_f is res_fused and torch.equal(res_fused, res_eager)      # residual += x, exact and in place
    assert torch.equal(res_fused, (res.float() + x.float()).to(dtype))
    diff = (out_f.float() - out_e.float()).abs()
    # the sum of squares is accumulated in another order: at most one rounding step of the output apart
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    assert (diff <= tol * out_e.float().abs().clamp_min(1e-3)).all(), diff.max()
    if dtype == torch.bfloat16:
        assert (out_f == out_e).float().mean() > 0.99
    # without a residual: normalises x itself and hands x back as the residual
    out, r = cpu_ops.rms_norm(x, w, 1e-6)
    eager = cpu_ops.rms_norm(x, w, 1e-6, fused=False)[0]
    assert r is x and torch.allclose(out.float(), eager.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_rows_are_batch_invariant(dtype):
    x, w = _rand(50, 256, dtype=dtype, seed=3), _rand(256, dtype=dtype, seed=4)
    whole = cpu_ops.rms_norm(x, w, 1e-6)[0]
    for n in (1, 3, 17):
        assert torch.equal(cpu_ops.rms_norm(x[:n].clone(), w, 1e-6)[0], whole[:n])
    assert torch.equal(cpu_ops.rms_norm(x[7:8].clone(), w, 1e-6)[0], whole[7:8])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_matches_eager_bit_for_bit(dtype):
    cfg = ModelConfig(arch="qwen2", vocab_size=64, hidden_size=128, intermediate_size=256, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=32, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096,
                      attention_bias=True, tie_word_embeddings=True)
    cos, sin = rope_tables(cfg, 4096)
    qkv = _rand(11, (4 + 2 * 2) * 32, dtype=dtype, seed=5)
    positions = torch.tensor([0, 1, 2, 3, 900, 901, 4095, 17, 5, 5, 6])
    fused = cpu_ops.rope_qkv(qkv.clone(), positions, cos, sin, 4, 2, 32)
    eager = cpu_ops.rope_qkv(qkv.clone(), positions, cos, sin, 4, 2, 32, fused=False)
    for a, b in zip(fused, eager):
        assert torch.equal(a, b)
    assert torch.equal(fused[2].reshape(11, -1), qkv[:, 6 * 32:])            # v is left alone
    with pytest.raises(RuntimeError, match="outside the table"):
        cpu_ops.rope_qkv(qkv.clone(), torch.tensor([0] * 10 + [4096]), cos, sin, 4, 2, 32)


@pytest.mark.parametrize("dtype,min_rows,key_block", [(torch.float32, 1, 1), (torch.bfloat16, 6, 64)])
def test_ragged_attention_matches_eager(dtype, min_rows, key_block):
    hq, hkv, d, layers = 6, 2, 64, 3
    # (tokens already cached, new tokens) per sequence: a decode step, a verification, a prefill chunk
    shapes = [(40, 1), (7, 5), (0, 23), (100, 1)]

    def caches(seed):
        out = []
        for i, (cached, new) in enumerate(shapes):
            kv = SeqKV(layers, hkv, d, dtype)
            kv.resize(-(-(cached + new) // key_block) * key_block)
            kv.k[:, :, :cached] = _rand(layers, hkv, cached, d, dtype=dtype, seed=seed + i)
            kv.v[:, :, :cached] = _rand(layers, hkv, cached, d, dtype=dtype, seed=seed + 10 + i)
            kv.length = cached
            out.append(kv)
        return out

    n = sum(t for _, t in shapes)
    q, k, v = (_rand(n, h, d, dtype=dtype, seed=s) for h, s in ((hq, 20), (hkv, 21), (hkv, 22)))
    results = []
    for fused in (True, False):
        kvs = caches(100)
        attn = causal_metadata([(kv, c, t) for kv, (c, t) in zip(kvs, shapes)], min_rows, key_block)
        out = cpu_ops.ragged_attention(q, k, v, attn, 1, fused=fused)
        results.append((out, kvs))
    (out_f, kv_f), (out_e, kv_e) = results
    assert out_f.shape == (n, hq * d) and torch.equal(out_f, out_e)
    for a, b in zip(kv_f, kv_e):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    # the new rows landed in layer 1 only, at each sequence's positions
    row = 0
    for kv, (cached, t) in zip(kv_f, shapes):
        assert torch.equal(kv.k[1, :, cached: cached + t], k[row: row + t].transpose(0, 1))
        assert not kv.k[2, :, cached: cached + t].any()
        row += t


def test_ragged_attention_rows_do_not_depend_on_neighbours():
    hq, hkv, d = 4, 2, 32
    kv_a, kv_b = SeqKV(1, hkv, d, torch.bfloat16), SeqKV(1, hkv, d, torch.bfloat16)
    for kv in (kv_a, kv_b):
        kv.resize(64)
        kv.k[:, :, :30] = _rand(1, hkv, 30, d, dtype=torch.bfloat16, seed=7)
        kv.v[:, :, :30] = _rand(1, hkv, 30, d, dtype=torch.bfloat16, seed=8)
    q, k, v = _rand(4, hq, d, dtype=torch.bfloat16, seed=9), _rand(4, hkv, d, dtype=torch.bfloat16, seed=10), \
        _rand(4, hkv, d, dtype=torch.bfloat16, seed=11)
    # the same sequence alone, and behind a 3-row neighbour
    alone = cpu_ops.ragged_attention(q[3:], k[3:], v[3:], causal_metadata([(kv_a, 30, 1)], 6, 64), 0)
    other = SeqKV(1, hkv, d, torch.bfloat16)
    other.resize(64)
    both = cpu_ops.ragged_attention(q, k, v, causal_metadata([(other, 0, 3), (kv_b, 30, 1)], 6, 64), 0)
    assert torch.equal(alone, both[3:])


def test_ragged_attention_refuses_a_cache_too_small():
    kv = SeqKV(1, 2, 32, torch.float32)
    kv.resize(4)
    q, k = _rand(8, 4, 32, dtype=torch.float32), _rand(8, 2, 32, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="cache too small"):
        cpu_ops.ragged_attention(q, k, k, causal_metadata([(kv, 0, 8)]), 0)


def _decode_caches(dtype, cached, seed=30, layers=2, hkv=2, d=128, capacity=384):
    kv = SeqKV(layers, hkv, d, dtype)
    kv.resize(capacity)
    kv.k[:, :, :cached] = _rand(layers, hkv, cached, d, dtype=dtype, seed=seed)
    kv.v[:, :, :cached] = _rand(layers, hkv, cached, d, dtype=dtype, seed=seed + 1)
    kv.length = cached
    return kv


PATHS = cpu_ops.ops_paths()      # the compiled paths this CPU runs: scalar, and avx512 / avx2 where present
# attention has more where the CPU has AVX-512 BF16 (its bf16 rows on vdpbf16ps) and AMX-BF16 (on tile products);
# fp32 rows take the AVX-512 path on both
ATTN_PATHS = PATHS + (["avx512bf16"] if ext.has_avx512_bf16() else []) + (["amx"] if ext.has_amx_bf16() else [])


def test_ops_paths_follow_the_cpu():
    assert PATHS[0] == "scalar" and set(PATHS) <= {"scalar", "avx512", "avx2"}
    assert ("avx2" in PATHS) == ext.has_avx2()
    auto = {2: "avx512", 3: "avx2", 1: "scalar"}[ext.ops_path(0)]
    assert auto == ("avx512" if "avx512" in PATHS else "avx2" if "avx2" in PATHS else "scalar")
    assert {2: "avx512", 3: "avx2", 1: "scalar"}[ext.ops_path(0, False, False)] == "scalar"   # no vector fits
    with pytest.raises(RuntimeError, match="impl is 0"):
        ext.ops_path(7)


@pytest.mark.parametrize("path", ATTN_PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [128, 16, 24, 20])      # 24: AVX2's 8 lanes only; 20: no vector width, scalar
def test_decode_rows_match_aten_attention(dtype, d, path):
    hq, hkv = 6, 2
    cached, t = 70, 9
    q, k, v = (_rand(t, h, d, dtype=dtype, seed=s) for h, s in ((hq, 40), (hkv, 41), (hkv, 42)))
    outs = []
    for decode in (True, False):
        kv = _decode_caches(dtype, cached, hkv=hkv, d=d)
        attn = causal_metadata([(kv, cached, t, decode)], 6 if dtype == torch.bfloat16 else 1,
                               64 if dtype == torch.bfloat16 else 1)
        outs.append(cpu_ops.ragged_attention(q, k, v, attn, 1, impl=path))
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(outs[0], outs[1], **tol)


@pytest.mark.parametrize("path", ATTN_PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 37])
def test_decode_rows_are_the_same_alone_or_verified_together(dtype, path, window):
    """A one-token step at position p and row p of a 19-row verification (or prompt chunk) give the same bits: on
    AVX2 the rows attend in blocks of 8 sharing each key's loads, but every row's scores, softmax and value sums are
    its own, over exactly keys 0..p (p - W + 1..p in a sliding window) in the same order (csrc/attention.cpp's
    invariant), whatever the blocks."""
    hq, hkv, d, t = 12, 2, 128, 19
    for cached in (5, 60, 63, 120, 333):
        q, k, v = (_rand(t, h, d, dtype=dtype, seed=s + cached) for h, s in ((hq, 50), (hkv, 51), (hkv, 52)))
        kv = _decode_caches(dtype, cached)
        together = cpu_ops.ragged_attention(q, k, v, causal_metadata([(kv, cached, t, True)], 6, 64), 0, impl=path,
                                            window=window)
        kv = _decode_caches(dtype, cached)
        for i in range(t):
            alone = cpu_ops.ragged_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1],
                                             causal_metadata([(kv, cached + i, 1, True)], 6, 64), 0, impl=path,
                                             window=window)
            assert torch.equal(alone, together[i:i + 1]), (cached, i)


@pytest.mark.parametrize("path", ATTN_PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_sliding_window_drops_the_keys_the_eager_mask_drops(dtype, path):
    """The compiled attention with a window (decode rows, a token tree's rows, prompt rows through ATen) against the
    eager masked attention; a window holding every key changes no bit."""
    hq, hkv, d, W = 6, 2, 64, 24
    # (cached, new, decode, tree): a step past the window, a verification across it, a prompt chunk, a tree
    shapes = [(70, 1, True, None), (20, 9, True, None), (50, 30, False, None), (90, 4, True, [[90], [91], [90, 92],
                                                                                            [91, 93]])]
    n = sum(t for _, t, _, _ in shapes)
    q, k, v = (_rand(n, h, d, dtype=dtype, seed=s) for h, s in ((hq, 80), (hkv, 81), (hkv, 82)))
    positions = torch.tensor([c + i for c, t, _, _ in shapes for i in range(t)])
    positions[-4:] = torch.tensor([90, 90, 91, 91])        # a tree row's position: its prefix + depth - 1
    min_rows, block = (6, 64) if dtype == torch.bfloat16 else (1, 1)

    def run(window, fused):
        kvs = [_decode_caches(dtype, c, seed=83 + c, layers=1, hkv=hkv, d=d, capacity=192) for c, *_ in shapes]
        spans = [(kv, c, t, dec) if tree is None else (kv, c, t, dec, tree_keys(tree, c))
                 for kv, (c, t, dec, tree) in zip(kvs, shapes)]
        return cpu_ops.ragged_attention(q, k, v, causal_metadata(spans, min_rows, block), 0, fused=fused,
                                        impl=path if fused else "auto", window=window, positions=positions)

    ours, eager, full = run(W, True), run(W, False), run(None, True)
    tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours, eager, **tol)
    assert not torch.allclose(ours, full, **tol)                    # keys were dropped
    assert torch.equal(run(1000, True), full)                       # a window past every key drops none


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [256, 40, 36])        # 40: AVX2's 8 lanes only; 36: no vector width, scalar
def test_silu_mul_matches_eager(dtype, inter, path):
    x = _rand(7, 2 * inter, dtype=dtype, seed=60, scale=4)
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])      # far tails: silu(-100) = -0, silu(100) = 100
    x[1, :3] = torch.tensor([-88.0, -87.0, 89.0])            # around the vector exp's clamps
    fused, eager = cpu_ops.silu_mul(x, impl=path), cpu_ops.silu_mul(x, fused=False)
    assert fused.shape == (7, inter) and fused.dtype == dtype
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=2 ** -7)
    torch.testing.assert_close(fused, eager, **tol)
    assert torch.equal(cpu_ops.silu_mul(x[3:4].clone(), impl=path), fused[3:4])        # rows are independent


@pytest.mark.skipif("avx512bf16" not in ATTN_PATHS, reason="this CPU lacks AVX-512 BF16 (vdpbf16ps)")
def test_bf16_dot_attention_is_auto_and_within_a_bf16_rounding_of_the_fp32_walk():
    """On an AVX-512 BF16 CPU auto attends bf16 rows with vdpbf16ps (its scores pair-wise, its weights rounded to
    bf16), or on AMX-BF16 tiles where the CPU has them: the output stays within a bf16 rounding or two of the fp32
    walk's and of the scalar reference, over key counts odd and even, in and past the 16-key blocks."""
    hq, hkv, d, t = 12, 2, 128, 19
    for cached in (0, 15, 62, 333):
        q, k, v = (_rand(t, h, d, dtype=torch.bfloat16, seed=s + cached) for h, s in ((hq, 90), (hkv, 91), (hkv, 92)))
        outs = {}
        for p in ("auto", "avx512bf16", "avx512", "scalar") + (("amx",) if "amx" in ATTN_PATHS else ()):
            kv = _decode_caches(torch.bfloat16, cached)
            outs[p] = cpu_ops.ragged_attention(q, k, v, causal_metadata([(kv, cached, t, True)], 6, 64), 0, impl=p)
        best = "amx" if "amx" in ATTN_PATHS else "avx512bf16"
        assert torch.equal(outs["auto"], outs[best]) and not torch.equal(outs["avx512bf16"], outs["avx512"])
        for p in ("avx512", "scalar"):
            torch.testing.assert_close(outs["avx512bf16"], outs[p], atol=8e-3, rtol=2 ** -7)


@pytest.mark.skipif("amx" not in ATTN_PATHS, reason="this CPU lacks AMX-BF16 (or Linux did not grant the tiles)")
@pytest.mark.parametrize("hq,hkv,d", [(12, 2, 128), (14, 2, 64), (4, 1, 256), (34, 2, 32)])
def test_amx_attention_is_its_rows_own_and_close_to_the_vdpbf16ps_walk(hq, hkv, d):
    """The tile path: each row's bits are its own (alone against 19 rows together, over key counts in and past the
    16-key score tiles and 32-key value products), within a bf16 rounding or two of the vdpbf16ps walk and the
    scalar reference; 17 heads per KV group (more than a tile's 16 columns) included."""
    t = 19
    for cached in (0, 13, 31, 32, 100):
        q, k, v = (_rand(t, h, d, dtype=torch.bfloat16, seed=s + cached) for h, s in ((hq, 95), (hkv, 96), (hkv, 97)))
        outs = {}
        for p in ("amx", "avx512bf16", "scalar"):
            kv = _decode_caches(torch.bfloat16, cached, hkv=hkv, d=d)
            outs[p] = cpu_ops.ragged_attention(q, k, v, causal_metadata([(kv, cached, t, True)], 6, 64), 0, impl=p)
        for p in ("avx512bf16", "scalar"):
            torch.testing.assert_close(outs["amx"], outs[p], atol=8e-3, rtol=2 ** -7)
        kv = _decode_caches(torch.bfloat16, cached, hkv=hkv, d=d)
        for i in range(t):   # each step writes its own key, as decoding does
            alone = cpu_ops.ragged_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1],
                                             causal_metadata([(kv, cached + i, 1, True)], 6, 64), 0, impl="amx")
            assert torch.equal(alone, outs["amx"][i:i + 1]), (cached, i)


def test_vector_paths_agree_closely():
    """Where a CPU has more than one vector path (AVX-512 machines run AVX2 too), they compute the same function:
    attention and SiLU within an fp32 rounding or two of each other."""
    x = _rand(5, 2 * 256, dtype=torch.float32, seed=61, scale=4)
    outs = [cpu_ops.silu_mul(x, impl=p) for p in PATHS]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-6, rtol=1e-6)
    hq, hkv, d, t, cached = 12, 2, 128, 4, 90
    q, k, v = (_rand(t, h, d, dtype=torch.float32, seed=s) for h, s in ((hq, 70), (hkv, 71), (hkv, 72)))
    att = []
    for p in PATHS:
        kv = _decode_caches(torch.float32, cached)
        att.append(cpu_ops.ragged_attention(q, k, v, causal_metadata([(kv, cached, t, True)], 1, 1), 0, impl=p))
    for o in att[1:]:
        torch.testing.assert_close(o, att[0], atol=2e-6, rtol=1e-5)
