"""The in-process interleaved A/B the docs/benchmarks ab.py scripts share (specdec/bench/interleaved.py)."""
import pytest

from specdec.bench.interleaved import interleave, ratio_medians, same_text


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
