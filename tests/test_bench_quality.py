"""`specdec bench quality`: perplexity, KL divergence and top-1 agreement of a scheme against the reference."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import CORPUS

from specdec.bench.quality import QualityConfig, compare, run_quality
from specdec.cli import main


def test_compare_is_zero_for_the_reference_and_grows_with_noise():
    g = torch.Generator().manual_seed(0)
    windows = [list(range(9)), list(range(3, 12))]
    ref = [torch.log_softmax(torch.randn(8, 16, generator=g) * 3, -1) for _ in windows]
    same = compare(ref, ref, windows)
    assert same["mean_kld"] == 0 and same["same_top1"] == 1 and same["positions"] == 16
    noisy = [torch.log_softmax(lp + torch.randn(lp.shape, generator=g), -1) for lp in ref]
    worse = [torch.log_softmax(lp + 4 * torch.randn(lp.shape, generator=g), -1) for lp in ref]
    a, b = compare(ref, noisy, windows), compare(ref, worse, windows)
    assert 0 < a["mean_kld"] < b["mean_kld"] and b["same_top1"] < 1
    assert a["p99_kld"] <= a["max_kld"]
    # perplexity is exp(mean NLL) of the text's own next tokens
    nll = torch.cat([-lp[torch.arange(8), torch.tensor(w[1:])] for lp, w in zip(ref, windows)])
    assert same["ppl"] == pytest.approx(float(nll.double().mean().exp()))


def test_quality_run_on_a_tiny_model(tiny_dirs, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(CORPUS)
    out = tmp_path / "q"
    result = run_quality(QualityConfig(target=str(tiny_dirs["target"]), schemes=["int8", "int4"], dtype="float32",
                                       text=str(text), num_tokens=128, window=64, out=str(out)))
    rows = {r["scheme"]: r for r in result["rows"]}
    assert list(rows) == ["none", "int8", "int4"]
    assert rows["none"]["mean_kld"] == 0 and rows["none"]["same_top1"] == 1 and rows["none"]["ppl_ratio"] == 1
    assert rows["none"]["positions"] == 2 * 63
    for s in ("int8", "int4"):
        assert rows[s]["mean_kld"] > 0 and 0 < rows[s]["same_top1"] <= 1
        assert rows[s]["weight_gb"] < rows["none"]["weight_gb"]
    assert rows["int4"]["mean_kld"] > rows["int8"]["mean_kld"]     # 4 bits lose more than 8
    saved = json.loads((out / "results.json").read_text())
    assert [r["scheme"] for r in saved["rows"]] == ["none", "int8", "int4"]
    assert "| int4 |" in (out / "report.md").read_text()


def test_quality_cli_rejects_bad_input(capsys, tmp_path):
    assert main(["bench", "quality", "--tokens", "10", "--window", "64"]) == 1
    assert "need --tokens >= --window" in capsys.readouterr().err
    assert main(["bench", "quality", "--schemes", "int3"]) == 1
    assert "unknown quantization 'int3'" in capsys.readouterr().err
    assert main(["bench", "quality", "--text", str(tmp_path / "missing.txt"), "--target", "nonexistent-model"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
