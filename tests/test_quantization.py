"""int4 block kernels and the quantization layer: accuracy against a float reference, exact batch
invariance, GGUF blocks kept without loss, portable == AVX-512 == AVX2, and the error when the kernels are missing.
No timing assertions (see `python -m specdec.bench.kernels` for speed)."""
from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdec.errors import SpecDecError
from specdec.models.quantization import kernels, linear_names, quantize_model
from specdec.models.quantization.blocks import dequantize, pack, quantize_blocks, quantize_int4, widen
from specdec.models.runner import forward_once

ext = pytest.importorskip("specdec._C", reason="specdec._C not built (needs a C++ compiler at install)")
from specdec.models.quantization.linear import BlockQuantLinear  # noqa: E402

# (bits, group, span): the formats GGUF blocks map onto (Q4_K, Q6_K, Q8_0 / Q5_0) and more; 3 bits: a draft's
# layers re-quantized (the VNNI and portable kernels only: elsewhere the portable one runs them)
FORMATS = [(4, 32, 256), (6, 16, 256), (8, 32, 32), (4, 16, 32), (8, 16, 256), (6, 32, 32), (3, 32, 256)]
WIDE = [f for f in FORMATS if f[0] != 3]


def _linear(n=80, k=896, fmt=(4, 32, 256), bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    codes = quantize_blocks(w, 3, search=True) if fmt[0] == 3 else widen(quantize_int4(w), *fmt)
    b = torch.randn(n, generator=g) if bias else None
    return BlockQuantLinear(pack(codes), b), dequantize(codes), b


def _random_codes(bits, group, span, n=80, k=896, seed=0):
    """Codes over the whole range of `bits` (quantize_int4 only ever makes 0..15)."""
    from specdec.models.quantization.blocks import BlockCodes

    g = torch.Generator().manual_seed(seed)
    ng, sb = k // group, span // group
    ns = -(-ng // sb)
    i8 = lambda lo, hi, shape: torch.randint(lo, hi, shape, generator=g).to(torch.int8)
    return BlockCodes(torch.randint(0, 1 << bits, (n, k), generator=g).to(torch.uint8), i8(-60, 64, (n, ng)),
                      i8(-60, 64, (n, ng)), (torch.rand(n, ns, generator=g) * 1e-3).half(),
                      (torch.rand(n, ns, generator=g) * 1e-3).half(), bits, group, sb).check()


def _run(lin, x, impl):
    old, BlockQuantLinear.impl = BlockQuantLinear.impl, impl
    try:
        return lin(x)
    finally:
        BlockQuantLinear.impl = old


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_matches_float_reference(fmt):
    # k = 896: 28 groups of 32, so the last superblock of 8 groups is partial (as in the 0.5B draft)
    lin, w, b = _linear(fmt=fmt)
    x = torch.randn(7, 896, generator=torch.Generator().manual_seed(1))
    ref = x @ w.T + b
    out = lin(x)
    assert out.shape == (7, 80)
    # the only error left is the int8 rounding of the activations (~0.5% here)
    assert ((out - ref).norm() / ref.norm()) < 0.02


def test_int4_quantizer_is_a_fair_4_bit_code():
    w = torch.randn(64, 512, generator=torch.Generator().manual_seed(0))
    c = quantize_int4(w)
    assert c.q.max() <= 15 and c.sc.min() >= 0 and c.mn.min() >= 0
    assert ((dequantize(c) - w).norm() / w.norm()) < 0.12     # ~8% for a Gaussian at 4.5 bits


def test_three_bit_codes_with_a_searched_range_err_less():
    """A draft's layers at 3 bits: codes 0..7, and the per-group range search never errs more than min-max."""
    w = torch.randn(64, 512, generator=torch.Generator().manual_seed(0))
    plain, searched = quantize_blocks(w, 3), quantize_blocks(w, 3, search=True)
    assert plain.q.max() <= 7 and searched.q.max() <= 7 and searched.bits == 3
    err = lambda c: (dequantize(c) - w).norm() / w.norm()
    assert err(searched) < err(plain) < 0.25                  # ~17% / ~15% for a Gaussian at 3.6 bits
    assert torch.equal(quantize_blocks(w, 4).q, quantize_int4(w).q)
    # an importance matrix weighs each input's error in the search: all ones is the plain search, and a weighted
    # search errs least by its own weighted measure
    imp = torch.rand(512, generator=torch.Generator().manual_seed(1))
    assert torch.equal(quantize_blocks(w, 3, search=True, importance=torch.ones(512)).q, searched.q)
    weighted = lambda c: ((dequantize(c) - w) ** 2 * imp).sum()
    assert weighted(quantize_blocks(w, 3, search=True, importance=imp)) <= weighted(searched)
    with pytest.raises(AssertionError, match="groups of 32"):
        widen(plain, 3, 16, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", FORMATS[:2])
def test_rows_are_bit_identical_for_any_row_count(dtype, fmt):
    lin, _, _ = _linear(n=48, k=512, fmt=fmt)
    x = torch.randn(300, 512).to(dtype)
    full = lin(x)
    for m in list(range(1, 17)) + [33, 300]:
        assert torch.equal(lin(x[:m]), full[:m]), m
    # and a row's result does not depend on its position among the others
    assert torch.equal(lin(x[[299, 5]]), full[[299, 5]])


@pytest.mark.skipif(not ext.has_avx512_vnni(), reason="this CPU has no AVX-512 VNNI kernel to compare against")
@pytest.mark.parametrize("fmt", FORMATS)
def test_portable_kernel_equals_avx512(fmt):
    """Every tile size of the AVX-512 kernel (1..9 rows; 19 rows run as 7 + 6 + 6) gives the portable kernel's bits."""
    lin, _, _ = _linear(fmt=fmt)
    x = torch.randn(19, 896)
    assert torch.equal(_run(lin, x, "portable"), _run(lin, x, "avx512"))
    lin = BlockQuantLinear(pack(_random_codes(*fmt)), torch.randn(80))
    for m in (1, 2, 5, 6, 7, 8, 9, 19):
        assert torch.equal(_run(lin, x[:m], "portable"), _run(lin, x[:m], "avx512")), m
    # bf16 in, bf16 out: the vector rounding to bf16 is c10::BFloat16's, down to outputs in bf16's subnormal range
    for scale in (1.0, 1e-35):
        xb = (x * scale).bfloat16()
        assert torch.equal(_run(lin, xb, "portable").view(torch.int16), _run(lin, xb, "avx512").view(torch.int16))


@pytest.mark.skipif(not ext.has_amx(), reason="this CPU (or its Linux) does not run AMX-INT8 tiles")
@pytest.mark.parametrize("fmt", WIDE)
def test_amx_kernel_equals_avx512(fmt):
    """The AMX kernel gives the VNNI kernel's bits: every row tail (1..33 rows: one or two 16-row tiles, partial; up to
    100: several blocks of 32 rows read from the codes' 64-k chunks, a partial block last), a
    superblock whose last 64-k chunk is partial (k = 864: 27 groups of 32), bf16 input (whose bf16 rows the AMX
    kernel rounds itself, down to bf16's subnormal range), and the extreme products (every activation at +-127
    against the extreme codes and group scales: q' = sc * q at the ends of int16)."""
    for k in (896, 864):
        if k % fmt[1]:
            continue
        codes = _random_codes(*fmt, k=k)
        lin = BlockQuantLinear(pack(codes), torch.randn(80))
        x = torch.randn(100, k, generator=torch.Generator().manual_seed(2))
        for m in list(range(1, 18)) + [31, 32, 33, 40, 64, 65, 81, 100]:
            assert torch.equal(_run(lin, x[:m], "amx"), _run(lin, x[:m], "avx512")), (k, m)
        for scale in (1.0, 1e-35):
            xb = (x * scale).bfloat16()
            assert torch.equal(_run(lin, xb, "amx").view(torch.int16), _run(lin, xb, "avx512").view(torch.int16))
    signs = torch.where(torch.randn(19, 896) > 0, 1.0, -1.0)
    codes = _random_codes(*fmt)
    for q, sc in ((0, -128), ((1 << fmt[0]) - 1, -128), ((1 << fmt[0]) - 1, 127)):
        edge = dataclasses.replace(codes, q=torch.full_like(codes.q, q), sc=torch.full_like(codes.sc, sc))
        lin = BlockQuantLinear(pack(edge), None)
        assert torch.equal(_run(lin, signs, "amx"), _run(lin, signs, "avx512")), (q, sc)


@pytest.mark.parametrize("fmt", [(4, 32, 256), (8, 32, 32), (3, 32, 256)])
def test_auto_kernel_takes_amx_from_its_row_count_with_the_same_bits(fmt):
    """`auto` switches kernels by row count (AMX from amx_min_rows where the CPU has it, for superblocks of 256 k; not
    for 3-bit codes, which it has no tile kernel for): a row's output does not change across the switch, and the
    threshold is settable."""
    lin = BlockQuantLinear(pack(_random_codes(*fmt)), torch.randn(80))
    x = torch.randn(64, 896)
    threshold = ext.amx_min_rows()
    try:
        ext.set_amx_min_rows(1)
        low = lin(x)
        ext.set_amx_min_rows(10**9)
        assert torch.equal(lin(x), low)
        assert ext.amx_min_rows() == 10**9
    finally:
        ext.set_amx_min_rows(threshold)
    assert 1 < threshold <= 64


@pytest.mark.skipif(not ext.has_avx2(), reason="this CPU has no AVX2 kernel to compare against")
@pytest.mark.parametrize("fmt", WIDE)
def test_portable_kernel_equals_avx2(fmt):
    """The AVX2 kernel (4-, 6- and 8-bit codes) gives the portable kernel's bits at every tile size (1..8 rows; 9 run
    as 5 + 4, 19 as 7 + 6 + 6), with a bias,
    up to the largest products: every activation at +-127 against the extreme codes (8-bit: |code - 128| = 128)."""
    lin, _, _ = _linear(fmt=fmt)
    x = torch.randn(19, 896)
    assert torch.equal(_run(lin, x, "portable"), _run(lin, x, "avx2"))
    codes = _random_codes(*fmt)
    lin = BlockQuantLinear(pack(codes), torch.randn(80))
    for m in list(range(1, 10)) + [19]:
        assert torch.equal(_run(lin, x[:m], "portable"), _run(lin, x[:m], "avx2")), m
    assert torch.equal(_run(lin, x.bfloat16(), "portable"), _run(lin, x.bfloat16(), "avx2"))
    signs = torch.where(x > 0, 1.0, -1.0)                          # every activation code is +-127
    for q in (0, (1 << fmt[0]) - 1):
        edge = BlockQuantLinear(pack(dataclasses.replace(codes, q=torch.full_like(codes.q, q))), None)
        ref = signs @ dequantize(dataclasses.replace(codes, q=torch.full_like(codes.q, q))).T
        out = _run(edge, signs, "avx2")
        assert torch.equal(out, _run(edge, signs, "portable")), q
        assert ((out - ref).norm() / ref.norm()) < 1e-3, q         # no saturated sum: the exact product


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_full_code_range_matches_reference(fmt):
    codes = _random_codes(*fmt)
    x = torch.randn(5, 896, generator=torch.Generator().manual_seed(2))
    ref = x @ dequantize(codes).T
    out = BlockQuantLinear(pack(codes), None)(x)
    assert ((out - ref).norm() / ref.norm()) < 0.02


def test_out_features_not_a_multiple_of_16():
    lin, w, b = _linear(n=37, k=64)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    out = lin(x)
    assert out.shape == (3, 37) and ((out - (x @ w.T + b)).norm() / out.norm()) < 0.02


# -- GGUF blocks -> codes, without loss ----------------------------------------------------------------
def _fp16(rng, shape, lo=1e-4, hi=1e-2, signed=False):
    v = rng.uniform(lo, hi, shape) * (rng.choice([-1, 1], shape) if signed else 1)
    return v.astype(np.float16)


def _random_blocks(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random but valid GGUF blocks of `qtype` for an [n, k] tensor (uint8 [n, row bytes])."""
    rng = np.random.default_rng(seed)
    per_row = {"Q4_K": k // 256, "Q6_K": k // 256, "Q8_0": k // 32, "Q5_0": k // 32}[qtype]
    nb = n * per_row
    byte = lambda c: rng.integers(0, 256, (nb, c), dtype=np.uint8)
    half = lambda signed: _fp16(rng, (nb, 1), signed=signed).view(np.uint8)
    if qtype == "Q4_K":
        blocks = [half(False), half(False), byte(12), byte(128)]
    elif qtype == "Q6_K":
        blocks = [byte(128), byte(64), byte(16), half(True)]
    elif qtype == "Q8_0":
        blocks = [half(True), byte(32)]
    else:
        blocks = [half(True), byte(4), byte(16)]
    return np.concatenate(blocks, axis=1).reshape(n, -1)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_draft_int4_is_four_bit_throughout(qtype, monkeypatch):
    """A target's int4 keeps 6/8-bit blocks exact; a draft's (int4_exact=False) re-quantizes them to 4 bits, and
    LLM loads its draft that way."""
    gguf = pytest.importorskip("gguf")
    from specdec.models.quantization.gguf_blocks import codes_for_int4

    n, k = 32, 512
    raw = _random_blocks(qtype, n, k)
    tensor = SimpleNamespace(name=f"test.{qtype}", tensor_type=gguf.GGMLQuantizationType[qtype],
                             shape=np.array([k, n]), data=raw)
    exact, four = codes_for_int4(tensor), codes_for_int4(tensor, exact=False)
    assert four.bits == 4 and exact.bits == (4 if qtype == "Q4_K" else {"Q6_K": 6}.get(qtype, 8))
    ref = torch.from_numpy(gguf.quants.dequantize(raw, tensor.tensor_type).reshape(n, k).astype(np.float32))
    if qtype == "Q4_K":
        assert torch.equal(dequantize(four), ref)       # already 4-bit: kept as it is
    else:                                               # rounded, but close: 4 bits of each group's range
        err = (dequantize(four) - ref).abs().max()
        assert 0 < err <= (ref.max() - ref.min()) / 15


def test_draft_mlp_at_three_bits_keeps_greedy_parity(tiny_dirs):
    """`draft_mlp_bits: 3`: the int4 draft's gate_up and down linears at 3 bits (a cache entry of their own), its
    attention at 4; the draft drafts with them and the output stays plain decoding's."""
    from specdec import LLM, SamplingParams
    from specdec.config import SpeculativeConfig
    from specdec.models.loader import load_model

    m = load_model(str(tiny_dirs["draft"]), dtype="bfloat16", device="cpu", progress=False, quantization="int4",
                   int4_exact=False, mlp_bits=3).model
    bits = {name.rsplit(".", 1)[-1]: mod.packed.bits for name, mod in m.named_modules()
            if isinstance(mod, BlockQuantLinear)}
    assert bits == {"qkv_proj": 4, "o_proj": 4, "gate_up_proj": 3, "down_proj": 3, "lm_head": 4}
    llm = LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="bfloat16", device="cpu",
              progress=False, speculative=SpeculativeConfig(method="draft", num_speculative_tokens=3,
                                                            quantization="int4", draft_mlp_bits=3))
    assert llm.models.draft_mlp_bits == 3
    assert llm.engine.drafting.proposers["draft"].status()["draft_mlp_bits"] == 3     # GET /v1/speculative/status
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    spec = llm.generate([5, 17, 42, 7, 99], params)[0]
    assert spec.token_ids == llm.generate([5, 17, 42, 7, 99], params, spec="none")[0].token_ids
    assert spec.stats.draft_tokens > 0
    with pytest.raises(ValueError, match="draft_mlp_bits"):
        SpeculativeConfig(method="draft", draft_mlp_bits=2)


def test_draft_mlp_at_three_bits_warns_where_no_vector_kernel_runs_them(tiny_dirs, monkeypatch, caplog):
    from specdec import LLM
    from specdec.config import SpeculativeConfig

    monkeypatch.setattr(kernels, "vector_kernel", lambda bits, group=32: bits != 3)    # an AVX2 CPU's answer
    with caplog.at_level("WARNING", logger="specdec"):
        LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="bfloat16", device="cpu",
            progress=False, speculative=SpeculativeConfig(method="draft", quantization="int4", draft_mlp_bits=3))
    assert any("no vector kernel for 3-bit codes" in r.getMessage() for r in caplog.records)


def test_a_gguf_draft_mlp_tensor_at_three_bits():
    """A GGUF tensor re-quantized to 3 bits for a draft's MLP: codes 0..7 from gguf's dequantization, within a 3-bit
    step of each group's range."""
    gguf = pytest.importorskip("gguf")
    from specdec.models.quantization.gguf_blocks import codes_for_bits

    n, k = 32, 512
    raw = _random_blocks("Q8_0", n, k)
    tensor = SimpleNamespace(name="test.Q8_0", tensor_type=gguf.GGMLQuantizationType["Q8_0"], shape=np.array([k, n]),
                             data=raw)
    three = codes_for_bits(tensor, 3)
    ref = torch.from_numpy(gguf.quants.dequantize(raw, tensor.tensor_type).reshape(n, k).astype(np.float32))
    assert three.bits == 3 and int(three.q.max()) <= 7
    assert 0 < (dequantize(three) - ref).abs().max() <= (ref.max() - ref.min()) / 7


def test_llm_loads_its_draft_four_bit(monkeypatch):
    import specdec.llm as llm_mod
    import specdec.loading as loading

    calls = []

    def fake_load(spec, **kw):
        calls.append((spec, kw))
        raise RuntimeError("stop here")

    monkeypatch.setattr(loading, "load_model", fake_load)
    # no file behind "t": the target's default quantization (read from its file) is the runtime dtype's here
    monkeypatch.setattr(loading, "default_quantization", lambda *a, **k: "none")
    with pytest.raises(RuntimeError, match="stop here"):
        llm_mod.LLM(target="t", draft="d", quantization="int4")
    assert calls[0][1].get("int4_exact", True) is True                # the target: exact blocks
    calls.clear()

    def fake_load_target_ok(spec, **kw):
        calls.append((spec, kw))
        if spec == "t":
            return SimpleNamespace(tokenizer=None, config=None)
        raise RuntimeError("stop here")

    monkeypatch.setattr(loading, "load_model", fake_load_target_ok)
    with pytest.raises(RuntimeError, match="stop here"):
        llm_mod.LLM(target="t", draft="d", quantization="int4",
                    speculative=llm_mod.SpeculativeConfig(method="draft", quantization="int4"))
    assert calls[1][0] == "d" and calls[1][1]["int4_exact"] is False
    # by default a bf16 CPU target's draft is int4 (4-bit throughout); --draft-quantization none keeps it bf16
    calls.clear()

    def fake_load_bf16_target(spec, **kw):
        calls.append((spec, kw))
        if spec == "t":
            weight = torch.zeros(1, dtype=torch.bfloat16)
            model = SimpleNamespace(embed_tokens=SimpleNamespace(weight=weight))
            return SimpleNamespace(tokenizer=None, config=None, model=model)
        raise RuntimeError("stop here")

    monkeypatch.setattr(loading, "load_model", fake_load_bf16_target)
    for requested, loaded in ((None, "int4"), ("none", "none"), ("int8", "int8")):
        calls.clear()
        with pytest.raises(RuntimeError, match="stop here"):
            llm_mod.LLM(target="t", draft="d",
                        speculative=llm_mod.SpeculativeConfig(method="draft", quantization=requested))
        assert calls[1][1]["quantization"] == loaded, requested


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_gguf_blocks_map_without_loss(qtype):
    gguf = pytest.importorskip("gguf")
    from specdec.models.quantization.gguf_blocks import codes_from_gguf

    n, k = 32, 512
    raw = _random_blocks(qtype, n, k)
    tensor = SimpleNamespace(name=f"test.{qtype}", tensor_type=gguf.GGMLQuantizationType[qtype],
                             shape=np.array([k, n]), data=raw)
    codes = codes_from_gguf(tensor)
    ref = torch.from_numpy(gguf.quants.dequantize(raw, tensor.tensor_type).reshape(n, k).astype(np.float32))
    assert torch.equal(dequantize(codes), ref)          # bit for bit
    assert (codes.bits, codes.group) == {"Q4_K": (4, 32), "Q6_K": (6, 16)}.get(qtype, (8, 32))
    # and the kernel computes with exactly those weights
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(1))
    out = BlockQuantLinear(pack(codes), None)(x)
    assert ((out - x @ ref.T).norm() / (x @ ref.T).norm()) < 0.02     # activations' int8 rounding


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_gguf_dequantize_in_longer_runs_is_ggufs_own_bit_for_bit(qtype):
    """The conversion's reference dequantization (gguf's row function over runs of DEQUANT_ROWS rows, a last run
    partial) gives gguf.quants.dequantize's float32 bits."""
    gguf = pytest.importorskip("gguf")
    from specdec.models.quantization.gguf_blocks import DEQUANT_ROWS, gguf_dequantize

    n, k = 2 * DEQUANT_ROWS + 5, 256
    raw = _random_blocks(qtype, n, k)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k)
    got = gguf_dequantize(raw, gguf.GGMLQuantizationType[qtype])
    assert got.shape == (n, k) and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.real_models
def test_real_target_blocks_map_without_loss():
    from specdec.gguf_file import open_gguf
    from specdec.models.quantization.gguf_blocks import codes_from_gguf
    from specdec.models.registry import BUILTIN_MODELS, assemble

    reader = open_gguf(assemble(BUILTIN_MODELS["qwen2.5-coder-1.5b-instruct"], progress=False))
    tensors = {t.name: t for t in reader.tensors}
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.1.attn_v.weight"):
        codes_from_gguf(tensors[name])     # raises unless our dequantization equals gguf's bit for bit


# -- the quantization layer on a model -------------------------------------------------------------------
def test_quantize_model_swaps_every_linear(tiny_dirs):
    from specdec.models.loader import load_model

    ref = load_model(str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False, pack=False).model
    q = load_model(str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False, quantization="int4").model
    assert linear_names(q) == []
    assert sum(isinstance(m, BlockQuantLinear) for m in q.modules()) == 4 * ref.config.num_layers + 1
    ids = [5, 17, 42, 7, 99, 3, 11, 250]
    # reference: the float model computing with exactly the int4 weights (a tiny random model amplifies
    # the 4-bit rounding itself too much to compare with the unquantized one)
    for name in linear_names(ref):
        lin = ref.get_submodule(name)
        lin.weight.data = dequantize(quantize_int4(lin.weight.data))
    a = forward_once(ref, ids)
    b = forward_once(q, ids)
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    # a second load reads the int4 conversion-cache entry back and gives the same model
    q2 = load_model(str(tiny_dirs["target"]), dtype="float32", device="cpu", progress=False, quantization="int4")
    assert not q2.converted
    assert torch.equal(forward_once(q2.model, ids), b)


def test_int4_model_steps_match_one_forward(tiny_dirs):
    """Batch invariance at model level: decoding one token at a time == one forward over all of them."""
    from specdec.models.loader import load_model

    m = load_model(str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False, quantization="int4").model
    from specdec.models.kv_manager import KVManager
    from specdec.models.runner import Span, forward_spans

    ids = [5, 17, 42, 7, 99, 3, 11, 250]
    full = forward_once(m, ids)
    kv = KVManager(m, 256).ensure(0, 8)
    forward_spans(m, [Span(kv, 0, ids[:3], "none")])
    steps = [forward_spans(m, [Span(kv, i, [ids[i]], "all")])[0] for i in range(3, 8)]
    assert torch.equal(torch.cat(steps), full[3:])


def test_int4_without_kernels_fails_clearly_and_bf16_still_works(tiny_dirs, monkeypatch):
    from specdec.models.loader import load_model

    monkeypatch.setattr(kernels, "_ext", None)
    monkeypatch.setitem(sys.modules, "specdec._C", None)     # import now fails as if never built
    with pytest.raises(SpecDecError, match="C\\+\\+ compiler"):
        load_model(str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False, quantization="int4")
    m = load_model(str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False).model
    with pytest.raises(SpecDecError, match="specdec._C"):
        quantize_model(m, "int4")
    assert forward_once(m, [1, 2]).shape[0] == 2


def test_unknown_scheme_is_rejected():
    with pytest.raises(SpecDecError, match="int4"):
        quantize_model(torch.nn.Module(), "int3")


def test_streamed_weights_move_to_huge_pages_unchanged():
    """Large weight tensors are copied into 2 MB-aligned memory advised for huge pages, bit for bit; a tensor that
    two fields share (Q6_K's mn = sc) stays shared; a small tensor is left where it is."""
    from specdec.models.hugepages import HUGE_PAGE, in_huge_pages

    big = torch.randn(1024, 1024)                                   # 4 MB
    moved = in_huge_pages(big)
    assert torch.equal(moved, big) and moved.data_ptr() != big.data_ptr()
    if sys.platform == "linux":
        assert moved.data_ptr() % HUGE_PAGE == 0
    small = torch.randn(16)
    assert in_huge_pages(small) is small
    p = pack(quantize_int4(torch.randn(64, 256)))
    p.mn = p.sc
    q = p.map(lambda t: t.clone())
    assert q.mn is q.sc and q.qw is not p.qw and torch.equal(q.qw, p.qw)


@pytest.mark.parametrize("file_type, quantized", [(15, True), (2, True), (1, False), (32, False)])
def test_default_quantization_keeps_a_quantized_gguf_in_its_blocks(tmp_path, tiny_dirs, file_type, quantized):
    """No --quantization: a block-quantized GGUF (Q4_K_M = 15, Q4_0 = 2) runs as int4 on a CPU whose kernels run
    4-bit codes vectorized; a float GGUF (F16 = 1, BF16 = 32), an HF directory or a GPU keep the runtime dtype."""
    gguf = pytest.importorskip("gguf")
    from specdec.models.loader import default_quantization
    from specdec.models.quantization.kernels import vector_kernel

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_file_type(file_type)
    w.add_tensor("x", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert default_quantization(str(path), "cpu") == ("int4" if quantized and vector_kernel(4) else "none")
    assert default_quantization(str(path), "cuda") == "none"
    assert default_quantization(str(tiny_dirs["target"]), "cpu") == "none"


def test_our_gguf_reader_reads_what_the_gguf_package_reads(tmp_path):
    """Our one-pass reader (metadata and tensors) against the gguf package's reader on a file with token arrays,
    scalars of several types, a float and two block-quantized tensors: every field's value, every tensor's name,
    shape, type and bytes; header_field (`specdec serve`'s start reads general.file_type with it) stops at its key;
    a missing key is the default, a cut file one error line."""
    gguf = pytest.importorskip("gguf")
    from specdec.errors import SpecDecError
    from specdec.gguf_file import field, header_field, open_gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_token_list([f"tok{i}\u2581é" for i in range(3000)])
    w.add_token_scores([float(i) for i in range(3000)])
    w.add_uint32("gemma3.block_count", 18)
    w.add_float32("gemma3.rope.freq_base", 1e6)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_file_type(15)
    w.add_array("tokenizer.ggml.token_type", [1, 3, 6] * 1000)
    w.add_tensor("x", np.arange(32, dtype=np.float32))
    rng = np.random.default_rng(0)
    q8 = gguf.quants.quantize(rng.standard_normal((4, 256)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    # a K-quant's bytes as they are (gguf has no Python quantizer for Q4_K): 144 bytes a 256-value block
    w.add_tensor("q4k", rng.integers(0, 256, (4, 2 * 144), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours, theirs = open_gguf(path), gguf.GGUFReader(str(path))
    assert list(ours.fields) == [k for k in theirs.fields if not k.startswith("GGUF.")]
    for key in ours.fields:
        assert field(ours, key) == theirs.fields[key].contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors] == ["x", "q8", "q4k"]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape.tolist() == b.shape.tolist()
        assert a.data.shape == b.data.shape and np.array_equal(np.asarray(a.data), np.asarray(b.data))
    for key in ("general.architecture", "gemma3.block_count", "gemma3.rope.freq_base",
                "tokenizer.ggml.add_bos_token", "general.file_type"):
        assert header_field(path, key) == theirs.fields[key].contents(), key
    assert header_field(path, "no.such.key", 7) == 7
    path.write_bytes(path.read_bytes()[:20000])
    with pytest.raises(SpecDecError, match="cannot read GGUF"):
        header_field(path, "general.file_type")
    with pytest.raises(SpecDecError, match="cannot read GGUF"):
        open_gguf(path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_selected_rows_compute_the_full_linears_columns(fmt):
    """PackedBlocks.select_rows (a draft's output head cut to some tokens) gathers rows without unpacking: the cut
    linear's outputs are the full one's columns bit for bit, in the order asked, whatever the tile."""
    full = BlockQuantLinear(pack(_random_codes(*fmt)), None)
    rows = torch.tensor([79, 3, 17, 16, 0, 45, 46, 47, 12, 64, 65, 31, 30, 2, 9, 77, 50, 51, 52])
    cut = BlockQuantLinear(full.packed.select_rows(rows), None)
    assert (cut.out_features, cut.in_features) == (len(rows), full.in_features)
    for m in (1, 5, 9):
        x = torch.randn(m, 896, generator=torch.Generator().manual_seed(m))
        assert torch.equal(cut(x), full(x)[:, rows])
