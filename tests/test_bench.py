"""`specdec bench` subcommands: what was `bench decode` is `bench offline` now (one A/B path, one report)."""
import json

import pytest

from specdec.cli import main
from specdec.errors import SpecDecError


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


def test_bench_serve_interleaves_prompts_across_endpoints(monkeypatch, tmp_path):
    """Round i of `concurrency` prompts goes to every endpoint (order rotating) before round i + 1; per category,
    the median decode tok/s and its ratio to the first endpoint's."""
    from specdec.bench import serve as bs

    prompts = [{"messages": [{"role": "user", "content": str(i)}], "category": "ab"[i % 2]} for i in range(5)]
    monkeypatch.setattr(bs, "load_prompts", lambda source, seed: prompts)
    calls = []
    speed = {0: 10.0, 1: 15.0}

    async def fake_level(cfg, idx, model, ps, concurrency, indices=None):
        if cfg.max_tokens == 8:                          # the warm-up
            return [], 0.0
        calls.append((idx, list(indices), concurrency))
        recs = [{"endpoint": cfg.labels[idx], "concurrency": concurrency, "prompt_index": i, "category": p["category"],
                 "ok": True, "error": None, "ttft_s": 0.1, "e2e_s": 1.1, "itl_s": [], "output_tokens": 11,
                 "decode_tok_s": speed[idx] * (2 if p["category"] == "b" else 1), "text": "x", "speculative": None,
                 "prompt_tokens": 100, "cached_tokens": 60 if idx == 1 else None}
                for i, p in zip(indices, ps)]
        return recs, 1.0

    monkeypatch.setattr(bs, "_level", fake_level)
    cfg = bs.ServeBenchConfig(endpoints=["http://a", "http://b"], model="m", concurrency=[1, 2], out=str(tmp_path))
    result = bs.run_serve_bench(cfg, progress=False)
    c1 = [(i, idx) for i, idx, c in calls if c == 1]
    assert c1 == [(0, [0]), (1, [0]), (1, [1]), (0, [1]), (0, [2]), (1, [2]), (1, [3]), (0, [3]), (0, [4]), (1, [4])]
    assert [idx for _, idx, c in calls if c == 2] == [[0, 1], [0, 1], [2, 3], [2, 3], [4], [4]]
    rows = {(r["endpoint"], r["concurrency"]): r for r in result["summary"]}
    b = rows[("1:http://b", 1)]
    assert b["decode_tok_s_by_category"] == {"a": 15.0, "b": 30.0}
    assert b["decode_ratio"] == pytest.approx(1.5) and b["decode_ratio_by_category"]["b"] == pytest.approx(1.5)
    assert rows[("0:http://a", 2)]["decode_ratio"] == pytest.approx(1.0)
    report = (tmp_path / "report.md").read_text()
    assert "30.00 (1.50x)" in report
    assert b["prompt_tokens"] == 500 and b["cached_tokens"] == 300 and rows[("0:http://a", 1)]["cached_tokens"] is None
    assert "| 1:http://b | 1 | 500 | 300 | 200 |" in report and "| 0:http://a | 1 | 500 | - | - |" in report
    assert (tmp_path / "decode_by_category_c1.png").is_file()
    calls.clear()
    bs.run_serve_bench(bs.ServeBenchConfig(endpoints=["http://a", "http://b"], model="m", out=str(tmp_path),
                                           interleave=False), progress=False)
    assert [(i, idx) for i, idx, _ in calls] == [(0, [0, 1, 2, 3, 4]), (1, [0, 1, 2, 3, 4])]


def test_bench_serve_rounds_report_each_slice_and_the_spread(monkeypatch, tmp_path):
    """--rounds 3 cuts 7 prompts into 3 disjoint slices (3, 2, 2; none sent twice); each round's median decode
    tok/s and ratio to the first endpoint's, then the median ratio over rounds with its min and max."""
    from specdec.bench import serve as bs

    prompts = [{"messages": [{"role": "user", "content": str(i)}], "category": "x"} for i in range(7)]
    monkeypatch.setattr(bs, "load_prompts", lambda source, seed: prompts)
    factor = {0: 1.5, 1: 2.0, 2: 1.2}                    # endpoint b over a, per round
    sent = []

    async def fake_level(cfg, idx, model, ps, concurrency, indices=None):
        if cfg.max_tokens == 8:
            return [], 0.0
        sent.extend((idx, i) for i in indices)
        recs = [{"endpoint": cfg.labels[idx], "concurrency": concurrency, "prompt_index": i, "category": "x",
                 "ok": True, "error": None, "ttft_s": 0.1, "e2e_s": 1.1, "itl_s": [], "output_tokens": 11,
                 "decode_tok_s": 10.0 * (factor[bs.round_of(i, 7, 3)] if idx else 1), "text": "x",
                 "speculative": None} for i in indices]
        return recs, 1.0

    monkeypatch.setattr(bs, "_level", fake_level)
    result = bs.run_serve_bench(bs.ServeBenchConfig(endpoints=["http://a", "http://b"], model="m", rounds=3,
                                                    out=str(tmp_path), wait_idle=False), progress=False)
    assert sorted(sent) == sorted((idx, i) for idx in (0, 1) for i in range(7))       # each prompt once each
    assert [bs.round_of(i, 7, 3) for i in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    b = result["summary"][1]
    assert [r["decode_ratio"] for r in b["rounds"]] == pytest.approx([1.5, 2.0, 1.2])
    assert b["decode_ratio_over_rounds"] == pytest.approx({"median": 1.5, "min": 1.2, "max": 2.0})
    assert "1.50x [1.20 - 2.00]" in (tmp_path / "report.md").read_text()
    with pytest.raises(SpecDecError, match="--rounds"):
        bs.ServeBenchConfig(endpoints=["http://a"], rounds=0)


def test_shared_prefix_requests_share_one_long_system_prompt():
    from specdec.bench.datasets import load_prompts

    ps = load_prompts("shared-prefix")
    assert len(ps) == 100 and len(load_prompts("shared-prefix:7")) == 7
    systems = {p["messages"][0]["content"] for p in ps}
    assert len(systems) == 1 and len(next(iter(systems))) > 3000 and "class TextWrapper" in next(iter(systems))
    assert len({p["messages"][1]["content"] for p in ps}) == 100


def test_long_prompts_are_long_and_real():
    """`long`: retrieval over pydoc text of the standard library (each answer inside the excerpt) and whole-module
    edits of its source, from text every Python installs."""
    from specdec.bench.datasets import load_prompts

    ps = load_prompts("long")
    cats = [p["category"] for p in ps]
    assert cats.count("rag-long") == 7 and cats.count("code-edit-long") == 6
    for p in ps:
        text = p["messages"][-1]["content"]
        assert len(text) > (8000 if p["category"] == "rag-long" else 3000), (p["category"], len(text))
    assert "def insort_left" in ps[7]["messages"][-1]["content"]          # bisect's own source
    assert len(load_prompts("long:3")) == 3


def test_overhead_pairs_served_and_offline_prompts(tmp_path, capsys):
    """python -m specdec.bench.overhead: per prompt, served / offline decode tok/s (offline: the median of its
    repeats), by category and over all."""
    import json

    from specdec.bench.overhead import main as overhead

    offline = {"runs": [{"method": m, "k": 0, "temperature": 0.0, "prompt_index": i, "category": c, "decode_tok_s": v}
                        for m, i, c, v in [("none", 0, "a", 20.0), ("none", 0, "a", 22.0), ("none", 0, "a", 10.0),
                                           ("none", 1, "b", 10.0), ("draft", 1, "b", 99.0)]]}
    served = {"requests": [{"ok": True, "concurrency": 1, "endpoint": "s", "prompt_index": i, "decode_tok_s": v}
                           for i, v in [(0, 19.0), (1, 10.0)]]}
    (tmp_path / "o.json").write_text(json.dumps(offline))
    (tmp_path / "s.json").write_text(json.dumps(served))
    assert overhead([str(tmp_path / "o.json"), str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "| a | 1 | 0.950 | +5.0% |" in out and "| b | 1 | 1.000 | +0.0% |" in out and "| all | 2 | 0.975 |" in out
    assert overhead([str(tmp_path / "o.json"), str(tmp_path / "missing.json")]) == 1


def test_bench_serve_conversations_resend_each_endpoints_own_history(monkeypatch, tmp_path):
    """--turns: turn t of a conversation goes to every endpoint (order rotating) before turn t + 1; each endpoint
    gets its own answers back as the assistant's turns; TTFT is summarized per turn and over turns 2..N."""
    from specdec.bench import serve as bs

    seen = []

    async def fake_one(client, url, body, headers):
        msgs = body["messages"]
        turn = sum(m["role"] == "user" for m in msgs)
        seen.append((url, turn, [m["content"][:12] for m in msgs]))
        if body["max_tokens"] == 8:                     # the warm-up
            return {"ok": True, "text": "hi", "ttft_s": 0.1, "e2e_s": 0.2, "decode_tok_s": None, "itl_s": []}
        slow = url.endswith("b")
        return {"ok": True, "error": None, "text": f"{url[-1]}-answer-{turn}",
                "ttft_s": (2.0 if turn == 1 else 0.2) * (2 if slow else 1), "e2e_s": 3.0, "itl_s": [],
                "decode_tok_s": 10.0, "output_tokens": 5, "prompt_tokens": 100 * turn,
                "cached_tokens": None if slow else 90 * (turn - 1)}

    monkeypatch.setattr(bs, "_one", fake_one)
    cfg = bs.ServeBenchConfig(endpoints=["http://a", "http://b"], model="m", out=str(tmp_path), turns=3)
    result = bs.run_serve_bench(cfg, progress=False)
    timed = [(url[-1], turn) for url, turn, _ in seen if not (turn == 1 and len(_) == 1 and _[0] == "Say hello.")]
    first = timed[:6]                                   # conversation 0: a, b | b, a | a, b by turn
    assert first == [("a", 1), ("b", 1), ("b", 2), ("a", 2), ("a", 3), ("b", 3)]
    third_turn_b = next(msgs for url, turn, msgs in seen if url.endswith("b") and turn == 3)
    assert third_turn_b[1] == "b-answer-1" and third_turn_b[3] == "b-answer-2" and len(third_turn_b) == 5
    rows = {r["endpoint"]: r for r in result["summary"]}
    a, b = rows["0:http://a"], rows["1:http://b"]
    assert a["ttft_turn1_p50_s"] == pytest.approx(2.0) and a["ttft_later_p50_s"] == pytest.approx(0.2)
    assert b["ttft_by_turn_p50_s"] == pytest.approx([4.0, 0.4, 0.4])
    assert a["cached_tokens_mean_later"] == pytest.approx(135) and b["cached_tokens_mean_later"] is None
    assert a["requests"] == 3 * len(bs_conversations()) and b["identical_to_first"] == 0.0
    assert "| 0:http://a | 2000 | 200 |" in (tmp_path / "report.md").read_text()
    with pytest.raises(SpecDecError, match="one conversation at a time"):
        bs.run_serve_bench(bs.ServeBenchConfig(endpoints=["http://a"], model="m", turns=2, concurrency=[2],
                                               out=str(tmp_path)), progress=False)


def bs_conversations():
    from specdec.bench.conversations import load_conversations

    return load_conversations("builtin", 3)


def test_sustained_load_mix_against_a_small_server(tiny_dirs, tmp_path, capsys):
    """`bench serve --duration`: more clients than the server admits, a mix of kinds and methods, aborts: no 5xx,
    every 429 with Retry-After, memory sampled, and the greedy answers replayed alone identical."""
    from server_utils import draft_llm, running_server

    from specdec import SpeculativeConfig
    from specdec.cli import main

    llm = draft_llm(tiny_dirs)
    with running_server(llm, SpeculativeConfig(method="draft", num_speculative_tokens=3), max_queued=1,
                        max_num_seqs=2) as (url, _):
        out = tmp_path / "load"
        rc = main(["bench", "serve", "--endpoint", url, "--duration", "6", "--concurrency", "6", "--max-tokens", "12",
                   "--replay", "6", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())
    s = result["summary"]
    assert s["requests"] > 10 and s["server_errors_5xx"] == 0
    # the only errors: prompts longer than the tiny model's 256-token window, refused in a clean 400
    assert all(e.startswith("400: This model's maximum context length") for e in s["clean_errors"])
    assert s["rate_limited_429"] > 0 and s["rate_limited_with_retry_after"] == s["rate_limited_429"]
    assert sum(row["aborted"] for row in s["by_kind"].values()) > 0
    assert {r["method"] for r in result["requests"]} >= {"", "none", "draft", "ngram"}
    assert s["replayed"] >= 3 and s["replayed_identical"] == s["replayed"]
    assert s["incomplete"] == 0 and s["rss_mb"]["start"] > 0 and s["ttft_s"]["p50"] <= s["ttft_s"]["p99"]
    assert "greedy answers replayed alone" in (out / "report.md").read_text()


def test_the_idle_gate_waits_for_a_quiet_window(monkeypatch):
    """wait_until_idle asks for windows until one shows at most max_busy of the CPUs busy (None: the load cannot be
    read, so nothing is waited for)."""
    from specdec.bench import idle

    real = idle.busy_fraction(0.05)
    assert real is None or 0.0 <= real <= 1.0               # a share of the CPUs, read from /proc/stat
    seen = iter([0.9, 0.6, 0.05, 0.9])
    calls = []
    monkeypatch.setattr(idle, "busy_fraction", lambda window_s: calls.append(window_s) or next(seen))
    idle.wait_until_idle(0.1, timeout_s=60, window_s=0.01)
    assert len(calls) == 3                                   # two busy windows, then a quiet one
    calls.clear()
    monkeypatch.setattr(idle, "busy_fraction", lambda window_s: calls.append(window_s))
    idle.wait_until_idle(0.1, timeout_s=60)
    assert len(calls) == 1
