"""`specdec bench` subcommands: what was `bench decode` is `bench offline` now (one A/B path, one report)."""
from specdec.cli import main


def test_bench_decode_is_folded_into_offline(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["bench", "decode", "--methods", "none"])
    assert exc.value.code == 2 and "invalid choice: 'decode'" in capsys.readouterr().err


def test_bench_rejects_unknown_method(capsys):
    rc = main(["bench", "offline", "--methods", "none,lookahead"])
    assert rc != 0 and "unknown method 'lookahead'" in capsys.readouterr().err


def test_bench_step_splits_a_decode_step_into_its_parts(tiny_dirs):
    from specdec import LLM, SpeculativeConfig
    from specdec.bench.step import measure
    from specdec.models import cpu_ops

    llm = LLM(target=str(tiny_dirs["target"]), dtype="bfloat16", device="cpu", progress=False,
              speculative=SpeculativeConfig(method="none"))
    before = cpu_ops.ragged_attention
    r = measure(llm, 3, 4)
    parts = r["parts_ms"]
    assert r["seqs"] == 3 and r["step_ms"] >= r["min_ms"] > 0
    assert {"layer linears", "output head", "attention", "norms, rotary, SiLU", "rest"} <= set(parts)
    assert all(v > 0 for k, v in parts.items() if k != "rest")
    # the wrappers are gone afterwards, and the engine holds nothing of the measurement
    assert cpu_ops.ragged_attention is before and "forward" not in llm.target.model.lm_head.__dict__
    assert not llm.engine.has_unfinished()
    # the compiled attention/SiLU path can be chosen (an A/B of the vector kernels against the scalar ones)
    called = []
    real = cpu_ops.silu_mul
    cpu_ops.silu_mul = lambda *a, **kw: called.append(kw.get("impl")) or real(*a, **kw)
    try:
        assert measure(llm, 1, 2, ops_impl="scalar")["ops_impl"] == "scalar"
    finally:
        cpu_ops.silu_mul = real
    assert called[-1] == "scalar" and set(called) <= {None, "scalar"}     # None: the prefill, before the timing
