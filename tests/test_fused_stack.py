"""The compiled decoder stack (csrc/stack.cpp) gives every row the bits the modules give it."""
from __future__ import annotations

import pytest
import torch

from specdec.models import fused_stack
from specdec.models.kv_manager import KVManager
from specdec.models.quantization import kernels
from specdec.models.runner import Span, forward_spans

pytestmark = pytest.mark.skipif(not kernels.available(), reason="needs specdec's compiled CPU kernels (specdec._C)")


def _load(path, dtype="bfloat16", quantization="int4"):
    from specdec.models.loader import load_model

    return load_model(str(path), dtype=dtype, device="cpu", progress=False, quantization=quantization).model


def _spans(m):
    """Two sequences in one forward: one with a prompt chunk after a cached prefix, one with a token tree."""
    mgr = KVManager(m, 256)
    a, b = mgr.ensure(0, 64), mgr.ensure(1, 64)
    forward_spans(m, [Span(a, 0, [5, 17, 42, 7], "none"), Span(b, 0, [9, 8, 7, 6, 5, 4], "none")])
    return [Span(a, 4, [99, 3, 11, 250, 31], "all"),
            Span(b, 6, [12, 40, 41, 60], "all", decode=True, parents=[-1, 0, 0, 1], hidden=True)]


def _both(m, monkeypatch, make_spans, aux=()):
    """(compiled, modules) results of the same forward on fresh caches."""
    assert m.fused_stack() is not None
    with_stack = forward_spans(m, make_spans(m), aux)
    monkeypatch.setattr(fused_stack, "runs_stack", lambda: False)
    assert m.fused_stack() is None
    modules = forward_spans(m, make_spans(m), aux)
    monkeypatch.undo()
    return with_stack, modules


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_stack_rows_equal_the_modules(tiny_dirs, monkeypatch, dtype):
    m = _load(tiny_dirs["target"], dtype)
    got, want = _both(m, monkeypatch, _spans)
    assert len(got) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w)


def test_stack_gives_the_hidden_states_a_head_reads(tiny_dirs, monkeypatch):
    m = _load(tiny_dirs["target"])
    layers = (0, 1, m.config.num_layers)
    (logits, hidden), (logits_ref, hidden_ref) = _both(m, monkeypatch, _spans, layers)
    assert hidden[0] is None and hidden_ref[0] is None
    assert sorted(hidden[1]) == sorted(layers)
    for i in layers:
        assert torch.equal(hidden[1][i], hidden_ref[1][i])
    assert all(torch.equal(a, b) for a, b in zip(logits, logits_ref))


def test_stack_keeps_a_sliding_window(tiny_dirs, monkeypatch):
    """Mistral's window: a row past it drops the keys the modules drop."""
    m = _load(tiny_dirs["target"])
    for layer in m.layers:
        layer.self_attn.window = 3
    m._stack_key = None      # the window is read when the stack is built

    def decode(m):
        mgr = KVManager(m, 256)
        kv = mgr.ensure(0, 64)
        forward_spans(m, [Span(kv, 0, [5, 17, 42, 7, 9, 8], "none", decode=True)])
        return [Span(kv, 6, [99, 3], "all", decode=True)]

    got, want = _both(m, monkeypatch, decode)
    assert torch.equal(got[0], want[0])
    for layer in m.layers:
        layer.self_attn.window = None
    m._stack_key = None
    assert not torch.equal(forward_spans(m, decode(m))[0], got[0])   # the window changed the rows


def test_stack_only_where_it_runs_what_the_modules_run(tiny_dirs, monkeypatch):
    assert _load(tiny_dirs["target"], quantization="none").fused_stack() is None      # bf16 linears
    m = _load(tiny_dirs["target"])
    stack = m.fused_stack()
    assert stack is not None and len(stack) == m.config.num_layers
    assert m.fused_stack() is stack                     # built once
    from specdec.models.quantization.linear import BlockQuantLinear

    monkeypatch.setattr(BlockQuantLinear, "impl", "portable")   # a kernel forced by a test: the modules run it
    assert m.fused_stack() is None
