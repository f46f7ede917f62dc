"""The in-process interleaved A/B the docs/benchmarks ab.py scripts share (specdec/bench/interleaved.py)."""
import json

import pytest

from specdec.bench.interleaved import interleave, methods_ran, ratio_medians, ratio_table, same_text, save, speed_tables


def test_every_prompt_runs_every_variant_in_a_rotated_order_before_the_next(capsys):
    prompts = [{"category": "a"}, {"category": "b"}, {"category": "a"}]
    seen = []

    def run(ids, variant, salt):
        seen.append((ids[0], variant, salt))
        return {"x": ids[0] * 10 + len(variant), "text": "t"}

    rows = interleave(prompts, [[1], [2], [3]], ["p", "qq", "rrr"], 2, run)
    assert [v for _, v, _ in seen[:3]] == ["p", "qq", "rrr"] and [v for _, v, _ in seen[3:6]] == ["qq", "rrr", "p"]
    assert [v for _, v, _ in seen[9:12]] == ["qq", "rrr", "p"]          # round 2 starts one further on
    assert [p for p, _, _ in seen] == [1] * 3 + [2] * 3 + [3] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert {s for _, _, s in seen} == {"r1", "r2"} and len(rows) == 18
    assert rows[4] == {"round": 1, "prompt": 1, "category": "b", "variant": "rrr", "x": 23, "text": "t"}
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 18 and '"text"' not in printed[0]


def test_ratios_are_medians_over_the_base_on_the_same_prompt_and_round():
    rows = [{"round": r, "prompt": p, "category": "ab"[p], "variant": v, "s": s, "text": t}
            for r, p, v, s, t in [(1, 0, "none", 10, "x"), (1, 0, "fast", 20, "x"), (1, 1, "none", 5, "y"),
                                  (1, 1, "fast", 20, "z"), (2, 0, "none", 20, "x"), (2, 0, "fast", 20, "x")]]
    got = ratio_medians(rows, ["none", "fast"], "s", lambda x, b: x / b)
    assert [(c, n) for c, n, _ in got] == [("a", 2), ("b", 1), ("all", 3)]
    assert got[0][2] == {"none": 1.0, "fast": pytest.approx(1.5)}       # 2.0 and 1.0 against their own rounds
    assert got[1][2]["fast"] == 4.0 and got[2][2]["fast"] == 2.0
    assert same_text(rows) == (2, 3)


def test_the_ratio_table_methods_and_saved_run(tmp_path, capsys):
    rows = [{"round": 1, "prompt": p, "category": "ab"[p], "variant": v, "s": s, "method": m, "text": "t"}
            for p, v, s, m in [(0, "none", 10, "none"), (0, "new", 30, "draft"), (0, "old", 20, "ngram"),
                               (1, "none", 10, "none"), (1, "new", 10, "ngram"), (1, "old", 20, "ngram")]]
    got = ratio_table(rows, ["none", "old", "new"], "s", lambda x, b: x / b,
                      [("new / old", lambda m: m["new"] / m["old"])])
    assert got == ["| category (requests) | old | new | new / old |", "|---|---|---|---|",
                   "| a (1) | 2.00x | 3.00x | 1.50 |", "| b (1) | 2.00x | 1.00x | 0.50 |",
                   "| all (2) | 2.00x | 2.00x | 1.00 |"]
    assert methods_ran(rows, "new") == "a draft x1, b ngram x1"
    save(tmp_path, {"rows": rows}, "report\n")
    assert (tmp_path / "report.md").read_text() == "report\n" and capsys.readouterr().out == "report\n\n"
    assert json.loads((tmp_path / "results.json").read_text())["rows"][1]["s"] == 30


def test_speed_tables_put_decode_over_off_then_off_over_the_variant():
    seen = []

    def table(rows, key, better):
        seen.append((key, better(2.0, 4.0)))
        return [f"| {key} |"]

    got = speed_tables([], table, " (note)", ": read counts")
    assert seen == [("decode_tok_s", 0.5), ("e2e_s", 2.0)]
    assert got == ["Decode speed (tokens after the first over the time after the first), over speculation off's "
                   "(note):", "", "| decode_tok_s |", "",
                   "End to end (speculation off's request time over the variant's: read counts):", "", "| e2e_s |"]
