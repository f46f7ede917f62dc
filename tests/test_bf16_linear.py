"""The AVX-512 BF16 linear (csrc/bf16_linear.cpp): close to an fp64 reference, every row bit-identical whatever
rows share the call (the property bf16 greedy parity rests on), any out_features, clear errors, and chosen for
bf16 models on a CPU that has it."""
from __future__ import annotations

import pytest
import torch

from specdec.models.packed_linear import Bf16Linear, PackedLinear, bf16_kernel_available, pack_bf16, pack_linear

ext = pytest.importorskip("specdec._C", reason="specdec._C not built (needs a C++ compiler at install)")
pytestmark = pytest.mark.skipif(not ext.has_bf16_linear(), reason="this CPU lacks AVX-512 BF16 and AVX2 + FMA")
# every path this CPU runs: AVX-512 BF16 where it exists, AVX2 + FMA on any x86-64 CPU of the last decade
IMPLS = ["avx512", "avx2"] if ext.has_avx512_bf16() else ["avx2"]


@pytest.fixture(params=IMPLS, autouse=True)
def impl(request, monkeypatch):
    monkeypatch.setattr(Bf16Linear, "impl", request.param)
    return request.param


def _rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


@pytest.mark.parametrize("n,k,bias", [(200, 96, True), (64, 1536, False), (1000, 2200, True)])
def test_matches_fp64_reference(n, k, bias):
    # n = 200 and 1000 are not multiples of 64 (padded super-block); k = 2200 spans five 512-pair chunks
    w, x = _rand(n, k, scale=0.05), _rand(13, k, seed=1)
    b = _rand(n, seed=2) if bias else None
    out = Bf16Linear(w, b)(x)
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    assert out.dtype == torch.bfloat16 and out.shape == (13, n)
    # fp32 accumulation, one bf16 rounding of the result
    assert torch.allclose(out.double(), ref, rtol=2 ** -7, atol=1e-3 * ref.abs().max().item())


def test_rows_do_not_depend_on_the_batch():
    w, b = _rand(320, 1100, scale=0.05), _rand(320, seed=3)
    lin = Bf16Linear(w, b)
    x = _rand(75, 1100, seed=4)
    full = lin(x)                                            # 75 rows: tiles of 6 and 7, several k chunks
    for lo, hi in [(0, 1), (5, 6), (3, 11), (0, 7), (10, 72), (74, 75), (20, 26)]:
        assert torch.equal(lin(x[lo:hi]), full[lo:hi]), (lo, hi)
    # the same row in another batch, at another offset
    other = torch.cat([_rand(4, 1100, seed=5), x[7:8], _rand(2, 1100, seed=6)])
    assert torch.equal(lin(other)[4], full[7])


def test_leading_dims_and_empty_batch():
    lin = Bf16Linear(_rand(128, 64, scale=0.1), None)
    x = _rand(2, 3, 64, seed=7)
    assert torch.equal(lin(x), lin(x.reshape(6, 64)).view(2, 3, 128))
    assert lin(x[:0].reshape(0, 64)).shape == (0, 128)


def test_bad_input_is_a_clear_error():
    lin = Bf16Linear(_rand(64, 32), None)
    with pytest.raises(RuntimeError, match="features"):
        ext.linear_bf16(_rand(2, 34), lin.packed, None, 64)
    with pytest.raises(RuntimeError, match="bf16"):
        ext.linear_bf16(torch.zeros(2, 32), lin.packed, None, 64)
    with pytest.raises(RuntimeError, match="impl"):
        ext.linear_bf16(_rand(2, 32), lin.packed, None, 64, 7)
    with pytest.raises(ValueError, match="even"):
        pack_bf16(_rand(64, 33))


def test_chosen_for_bf16_only():
    assert bf16_kernel_available(torch.zeros(1, dtype=torch.bfloat16))
    assert isinstance(pack_linear(_rand(64, 32), None), Bf16Linear)
    assert isinstance(pack_linear(torch.randn(64, 32), None), PackedLinear)      # fp32 stays on oneDNN


def test_avx2_and_avx512_agree_closely():
    """Two summation orders of the same fp32 products: equal up to a bf16 rounding step or so."""
    if not ext.has_avx512_bf16():
        pytest.skip("one path only on this CPU")
    w, x = _rand(96, 640, scale=0.05), _rand(5, 640, seed=8)
    lin = Bf16Linear(w, None)
    outs = {}
    for name in IMPLS:
        Bf16Linear.impl = name
        outs[name] = lin(x).double()
    assert torch.allclose(outs["avx2"], outs["avx512"], rtol=2 ** -6, atol=1e-3)
