"""`specdec bench decode` end to end on tiny models (speed itself is never asserted in tests)."""
import json

from specdec.cli import main


def test_bench_decode_tiny(capsys, tiny_dirs, tmp_path):
    out = tmp_path / "bench.json"
    rc = main(["bench", "decode", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]),
               "--methods", "none,ngram,draft", "--k", "2,3", "--categories", "code-gen", "--max-tokens", "8",
               "--dtype", "float32", "--out", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "ngram" in table and "draft" in table
    result = json.loads(out.read_text())
    assert {(r["method"], r["k"]) for r in result["rows"]} == {("none", 0), ("ngram", 2), ("ngram", 3),
                                                               ("draft", 2), ("draft", 3)}
    # float32 greedy: every speculative run is token-identical to the baseline
    assert all(r["parity"] == 1.0 for r in result["rows"])
    assert all(r["speedup"] > 0 for r in result["rows"])


def test_bench_rejects_unknown_method(capsys):
    rc = main(["bench", "decode", "--methods", "none,medusa"])
    assert rc != 0 and "unknown method 'medusa'" in capsys.readouterr().err
