"""`specdec serve` through the official openai client and raw HTTP, on tiny models over loopback."""
import asyncio
import faulthandler
import json
import re
import threading
import time

import httpx
import pytest
from server_utils import draft_llm, running_server

from specdec import SpeculativeConfig

CJK = "你好，世界！ 缓存 🙂 The quick brown fox"


@pytest.fixture(scope="module")
def llm(tiny_dirs):
    return draft_llm(tiny_dirs)


@pytest.fixture(scope="module")
def solo_llm(tiny_dirs):
    """For the servers a test starts itself: an engine serves one server only, and the module's server (on `llm`)
    stays up meanwhile."""
    return draft_llm(tiny_dirs)


@pytest.fixture(scope="module")
def server(llm):
    with running_server(llm, SpeculativeConfig(method="draft", num_speculative_tokens=3)) as (url, state):
        yield url, state


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


def _metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{" if labels == "" else name + "{") and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _chat(client, content, stream=False, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                          stream=stream, **kw)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    h = httpx.get(server[0] + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"


@pytest.mark.parametrize("content", ["def add(a, b):", CJK])
def test_chat_stream_equals_non_stream(client, content):
    full = _chat(client, content, max_tokens=40)
    assert full.choices[0].finish_reason in ("stop", "length")
    assert full.model_extra["speculative"]["method"] == "draft"
    chunks = list(_chat(client, content, stream=True, max_tokens=40, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == full.choices[0].finish_reason
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == full.usage.completion_tokens
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens


def test_completions_stream_and_non_stream(client):
    full = client.completions.create(model="tiny", prompt=CJK, max_tokens=30, temperature=0)
    parts = list(client.completions.create(model="tiny", prompt=CJK, max_tokens=30, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == full.choices[0].text
    assert parts[-1].usage.completion_tokens == full.usage.completion_tokens
    ids = client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=5, temperature=0)
    assert ids.usage.prompt_tokens == 4


@pytest.mark.parametrize("n", [1, 7, 33])
def test_exact_max_tokens(client, n):
    r = _chat(client, "count", max_tokens=n, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == n and r.choices[0].finish_reason == "length"
    r2 = _chat(client, "count", max_completion_tokens=n, extra_body={"ignore_eos": True})
    assert r2.usage.completion_tokens == n


def test_stop_string(client):
    base = _chat(client, "The quick brown", max_tokens=40, extra_body={"ignore_eos": True}).choices[0].message.content
    stop = base[10:13]
    assert stop.strip(), base
    r = _chat(client, "The quick brown", max_tokens=40, stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == base[: base.index(stop)]
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       _chat(client, "The quick brown", stream=True, max_tokens=40, stop=[stop],
                             extra_body={"ignore_eos": True}) if c.choices)
    assert streamed == r.choices[0].message.content


def test_per_request_speculative_override(client):
    a = _chat(client, "def add(a, b):", max_tokens=30, extra_body={"speculative": {"method": "none"}})
    b = _chat(client, "def add(a, b):", max_tokens=30, extra_body={"speculative": {"num_speculative_tokens": 2}})
    c = _chat(client, "def add(a, b):", max_tokens=30, extra_body={"speculative": {"method": "ngram"}})
    d = _chat(client, "def add(a, b):", max_tokens=30, extra_body={"speculative": {"draft_p_min": 0.0}})
    assert a.model_extra["speculative"]["method"] == "none"
    assert b.model_extra["speculative"]["num_speculative_tokens"] == 2
    assert c.model_extra["speculative"]["method"] == "ngram"
    assert a.choices[0].message.content == b.choices[0].message.content == c.choices[0].message.content \
        == d.choices[0].message.content


def _post(url, body, path="/v1/chat/completions", headers=None):
    return httpx.post(url + path, content=body if isinstance(body, (bytes, str)) else json.dumps(body), timeout=30,
                      headers={"Content-Type": "application/json", **(headers or {})})


MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    ({"messages": "hi"}, "messages"),
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": MSG, "temperature": -1}, "temperature"),
    ({"messages": MSG, "top_p": 0}, "top_p"),
    ({"messages": MSG, "top_p": 1.5}, "top_p"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_tokens": "ten"}, "max_tokens"),
    ({"messages": MSG, "n": 0}, "n"),
    ({"messages": MSG, "stop": [""]}, "stop"),
    ({"messages": MSG, "speculative": {"method": "lookahead"}}, "speculative.method"),
    ({"messages": MSG, "speculative": {"method": "eagle3"}}, "speculative.method"),       # no head loaded
    ({"messages": MSG, "speculative": {"num_speculative_tokens": 0}}, "speculative.num_speculative_tokens"),
    ({"messages": MSG, "speculative": {"method": "ngram", "eagle_topk": 2}}, "speculative"),   # trees need a head
    ({"messages": MSG, "speculative": {"eagle_topk": 0}}, "speculative.eagle_topk"),
    ({"messages": MSG, "speculative": {"draft_p_min": 1.0}}, "speculative.draft_p_min"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
])
def test_bad_requests_are_400_with_openai_shape(server, body, param):
    r = _post(server[0], body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param:
        assert err["param"] == param


def test_unknown_model_404_and_unknown_route(server):
    r = _post(server[0], {"model": "gpt-9", "messages": MSG})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(server[0] + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_context_window_400_before_generation(server):
    url, state = server
    before = _metric(url, "specdec:request_success_total")
    r = _post(url, {"messages": [{"role": "user", "content": "word " * 5}], "max_tokens": 250})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    nums = [int(x) for x in re.findall(r"\d+", msg)]
    assert state.max_model_len in nums and 250 in nums
    r = _post(url, {"prompt": "word " * 400, "max_tokens": 1}, path="/v1/completions")
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]
    assert _metric(url, "specdec:request_success_total") == before


def _slow_steps(monkeypatch, delay=0.01):
    """Tiny models step in about a millisecond: slow each step so requests overlap and clients can leave in time."""
    from specdec.engine import LLMEngine

    real_step = LLMEngine.step

    def slow_step(self):
        time.sleep(delay)
        return real_step(self)

    monkeypatch.setattr(LLMEngine, "step", slow_step)


def _hist(url: str, name: str) -> tuple[float, float]:
    """(observations <= 1, all observations) of a histogram."""
    return _metric(url, name + "_bucket", 'le="1.0"'), _metric(url, name + "_count")


def test_concurrent_greedy_equals_alone(server, client, monkeypatch):
    prompts = ["def add(a, b):", CJK, "class Cache:", "The lazy dog"]
    alone = [_chat(client, p, max_tokens=20).choices[0].message.content for p in prompts]
    _slow_steps(monkeypatch)
    single_before, steps_before = _hist(server[0], "specdec:iteration_num_seqs")

    async def together():
        from openai import AsyncOpenAI

        ac = AsyncOpenAI(base_url=client.base_url, api_key="unused", max_retries=0)
        rs = await asyncio.gather(*[ac.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": p}], max_tokens=20, temperature=0) for p in prompts])
        return [r.choices[0].message.content for r in rs]

    assert asyncio.run(together()) == alone
    single, steps = _hist(server[0], "specdec:iteration_num_seqs")
    # some forwards carried two or more of the requests (continuous batching), and output did not change
    assert steps - steps_before > single - single_before


def test_metrics_move(server, client, caplog):
    caplog.set_level("INFO", logger="specdec.server")
    url = server[0]
    drafts = _metric(url, "specdec:spec_decode_num_drafts_total")
    drafted = _metric(url, "specdec:spec_decode_num_draft_tokens_total")
    ok = _metric(url, "specdec:request_success_total")
    r = _chat(client, "def add(a, b):", max_tokens=20, extra_body={"ignore_eos": True})
    spec = r.model_extra["speculative"]
    assert _metric(url, "specdec:spec_decode_num_drafts_total") == drafts + spec["draft_steps"] > drafts
    assert _metric(url, "specdec:spec_decode_num_draft_tokens_total") == drafted + spec["draft_tokens"]
    assert _metric(url, "specdec:request_success_total") == ok + 1
    text = httpx.get(url + "/metrics").text
    for name in ("specdec:spec_decode_num_accepted_tokens_total",
                 "specdec:spec_decode_num_accepted_tokens_per_pos_total",
                 "specdec:time_to_first_token_seconds_bucket", "specdec:time_per_output_token_seconds_bucket",
                 "specdec:e2e_request_latency_seconds_bucket", "specdec:num_requests_running",
                 "specdec:num_requests_waiting"):
        assert name in text
    assert 'position="0"' in text
    deadline = time.time() + 5             # the periodic log line (every 0.5 s in these tests)
    while not any("SpecDecoding metrics" in r.message for r in caplog.records) and time.time() < deadline:
        time.sleep(0.1)
    line = next(r.message for r in caplog.records if "SpecDecoding metrics" in r.message)
    assert "mean acceptance length" in line and "acceptance rate" in line and "draft overhead" in line
    assert "throughput" in line


def test_disconnect_mid_stream_and_while_queued_aborts(solo_llm, monkeypatch):
    _slow_steps(monkeypatch)
    with running_server(solo_llm, SpeculativeConfig(method="draft", num_speculative_tokens=3), max_num_seqs=1) as srv:
        _disconnects(srv, solo_llm)


def _disconnects(server, llm):
    from openai import OpenAI

    client = OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)
    url, state = server
    aborted = _metric(url, "specdec:request_aborted_total")
    long_body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 200, "ignore_eos": True,
                 "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", url + "/v1/chat/completions", json=long_body) as r:
            it = r.iter_lines()
            got = [next(it) for _ in range(4)]
            assert got[0].startswith("data: ")
        # the stream is closed here, mid-generation
    deadline = time.time() + 10
    while _metric(url, "specdec:request_aborted_total") < aborted + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert _metric(url, "specdec:request_aborted_total") == aborted + 1
    # while queued: A occupies the engine; B's client gives up before B starts
    a_done = {}

    def run_a():
        a_done["r"] = _post(url, {**long_body, "stream": False, "max_tokens": 120})

    t = threading.Thread(target=run_a)
    t.start()
    while state.engine.num_running == 0:
        time.sleep(0.01)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url + "/v1/chat/completions", json={**long_body, "stream": False}, timeout=0.3)
    t.join()
    assert a_done["r"].status_code == 200 and a_done["r"].json()["usage"]["completion_tokens"] == 120
    deadline = time.time() + 10
    while _metric(url, "specdec:request_aborted_total") < aborted + 2 and time.time() < deadline:
        time.sleep(0.05)
    assert _metric(url, "specdec:request_aborted_total") == aborted + 2
    assert state.engine.num_running == 0 and state.engine.num_waiting == 0
    # no KV or draft cache left behind by the aborted requests
    assert llm.engine.kv.num_seqs == 0 and llm.engine.proposers["draft"].kv.num_seqs == 0
    # the server goes on
    assert _chat(client, "still there?", max_tokens=5).usage.completion_tokens >= 1


def test_burst_beyond_queue_gets_429(solo_llm, monkeypatch):
    # the engine is held while the burst arrives, so no request finishes and frees its place meanwhile: with one
    # running slot and two queue places exactly three are admitted, whatever the machine's speed
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    go = threading.Event()
    go.set()
    real_step = solo_llm.engine.step

    def held_step():
        go.wait()
        return real_step()

    monkeypatch.setattr(solo_llm.engine, "step", held_step)
    with running_server(solo_llm, spec, max_queued=2, max_num_seqs=1) as (url, state):
        body = {"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 40, "temperature": 0,
                "ignore_eos": True}
        solo = _post(url, body).json()["choices"][0]["message"]["content"]

        async def burst():
            async with httpx.AsyncClient(timeout=120) as c:
                tasks = [asyncio.create_task(c.post(url + "/v1/chat/completions", json=body)) for _ in range(30)]
                deadline = time.monotonic() + 60
                while sum(t.done() for t in tasks) < 27 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                if sum(t.done() for t in tasks) < 27:
                    # where every thread, the server's event loop among them, sits while requests wait unanswered
                    # (seen in 2 of 7 runs on a slow VM before the engine loop added the requests it takes under the
                    # admission lock: taken and not yet added they counted nowhere, and more than 3 were admitted)
                    faulthandler.dump_traceback(all_threads=True)
                go.set()
                return await asyncio.gather(*tasks)

        go.clear()
        try:
            rs = asyncio.run(burst())
        finally:
            go.set()
        codes = [r.status_code for r in rs]
        assert codes.count(429) == 27 and codes.count(200) == 3
        for r in rs:
            if r.status_code == 429:
                assert r.headers["retry-after"] and r.json()["error"]["type"] == "rate_limit_error"
            else:
                assert r.json()["choices"][0]["message"]["content"] == solo
        assert _metric(url, "specdec:request_rejected_total") == 27


def test_failing_request_does_not_take_down_others(solo_llm, monkeypatch):
    from specdec.engine.commit import Committer

    real = Committer.sampled

    def flaky(self, seq, *args):                 # a fault in one sequence's part of a step
        if 7 in seq.prompt_ids and len(seq.output_ids) > 2:
            raise RuntimeError("injected fault")
        return real(self, seq, *args)

    monkeypatch.setattr(Committer, "sampled", flaky)
    with running_server(solo_llm, SpeculativeConfig(method="none")) as (url, state):
        bad = _post(url, {"prompt": [7, 8, 9], "max_tokens": 20, "ignore_eos": True}, path="/v1/completions")
        assert bad.status_code == 500 and "injected fault" in bad.json()["error"]["message"]
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"prompt": [7, 8, 9], "max_tokens": 20, "ignore_eos": True, "stream": True}) as r:
            lines = [ln for ln in r.iter_lines() if ln]
        assert "injected fault" in lines[-2] and lines[-1] == "data: [DONE]"
        good = _post(url, {"prompt": [5, 8, 9], "max_tokens": 20, "ignore_eos": True}, path="/v1/completions")
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 20
        assert httpx.get(url + "/health").status_code == 200


def test_api_key(solo_llm):
    with running_server(solo_llm, SpeculativeConfig(method="none"), api_key="sekret") as (url, _):
        r = _post(url, {"messages": MSG, "max_tokens": 2})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = _post(url, {"messages": MSG, "max_tokens": 2}, headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200
        assert httpx.get(url + "/health").status_code == 200      # health and metrics stay open


@pytest.fixture(scope="module")
def short_server(tiny_dirs):
    """The server the property-based run hits: the tiny pair with a 64-token window, so that a generated request
    asking for hundreds of tokens is answered (or refused) in a few steps; what is checked is the answer's status."""
    from specdec import LLM

    llm = LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", device="cpu",
              max_model_len=64, speculative=SpeculativeConfig(method="draft", num_speculative_tokens=3),
              progress=False)
    with running_server(llm, SpeculativeConfig(method="draft", num_speculative_tokens=3)) as (url, state):
        yield url, state


def test_schemathesis_no_server_errors(short_server):
    """Property-based requests generated from our own /openapi.json (its examples, every field's boundary values,
    then random ones; no stateful phase: the API has no links between operations): never a 5xx."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    proc = subprocess.run([exe, "run", short_server[0] + "/openapi.json", "--checks", "not_a_server_error",
                           "--phases", "examples,coverage,fuzzing", "--max-examples", "6", "--seed", "7",
                           "--workers", "1", "--request-timeout", "60", "--no-color"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # a warning may say GET/DELETE /v1/responses/{id} only met unknown ids (404): no failure is listed
    assert "❌" not in proc.stdout and " passed" in proc.stdout, proc.stdout[-3000:]


def test_sigterm_drains_in_flight_and_exits_0(tiny_dirs, tmp_path):
    import signal

    from server_utils import server_process

    args = ["--target", str(tiny_dirs["target"]), "--dtype", "float32", "--draft", str(tiny_dirs["draft"]),
            "--drain-timeout", "20", "--served-model-name", "tiny"]
    with server_process(args, tmp_path / "server.log") as (proc, url):
        # the default speculative config is method auto
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "tiny"
        assert httpx.get(url + "/v1/speculative/status").json()["default"]["method"] == "auto"
        body = {"messages": MSG, "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True}
        lines = []
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                if len(lines) == 2:
                    proc.send_signal(signal.SIGTERM)       # mid-stream
        assert lines[-1] == "data: [DONE]"
        final = json.loads(lines[-2][len("data: "):])
        assert final["choices"][0]["finish_reason"] == "length"   # the in-flight request was finished, not cut
        assert proc.wait(timeout=60) == 0
    out = (tmp_path / "server.log").read_text()
    assert "specdec is ready" in out and "curl http://127.0.0.1" in out


def test_bench_serve_against_our_server(server, tmp_path, capsys):
    from specdec.cli import main

    url = server[0]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": c}], "category": "t"})
                                 for c in ["def add(a, b):", CJK, "class Cache:"]) + "\n")
    out = tmp_path / "bench"
    rc = main(["bench", "serve", "--endpoint", url, "--endpoint", url + "/v1", "--label", "spec", "--label", "plain",
               "--extra-body", "{}", "--extra-body", '{"speculative": {"method": "none"}}', "--dataset", str(prompts),
               "--concurrency", "1,2", "--max-tokens", "16", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())
    rows = {(r["endpoint"], r["concurrency"]): r for r in result["summary"]}
    assert set(rows) == {("spec", 1), ("spec", 2), ("plain", 1), ("plain", 2)}
    for r in rows.values():
        assert r["completed"] == 3 and r["errors"] == 0 and r["output_throughput"] > 0
        assert r["ttft_p50_s"] <= r["ttft_p99_s"] and r["e2e_p99_s"] >= r["e2e_p50_s"]
    assert rows[("spec", 1)]["acceptance_rate"] is not None and rows[("plain", 1)]["acceptance_rate"] is None
    # greedy: speculation on and off give the same completions
    assert rows[("plain", 1)]["identical_to_first"] == 1.0 and rows[("plain", 2)]["identical_to_first"] == 1.0
    assert all(r["output_tokens"] <= 16 for r in result["requests"])
    assert (out / "report.md").exists() and (out / "serve_latency_throughput.png").exists()


def test_bench_serve_bad_input(capsys):
    from specdec.cli import main

    assert main(["bench", "serve", "--endpoint", "localhost:8000"]) == 1
    assert "http(s) URL" in capsys.readouterr().err
    assert main(["bench", "serve", "--endpoint", "http://127.0.0.1:9", "--extra-body", "{nope"]) == 1
    assert "--extra-body" in capsys.readouterr().err
    assert main(["bench", "serve", "--endpoint", "http://127.0.0.1:9", "--dataset", "builtin"]) == 1
    assert "cannot list models" in capsys.readouterr().err


def test_auto_policy_rollout_pools_and_status(solo_llm):
    from specdec.policy.pools import rollout_arm

    with running_server(solo_llm, SpeculativeConfig(method="auto")) as (url, state):
        state.traffic_fraction = 0.5
        arms = {}
        for i in range(16):
            rid = f"rollout-{i}"
            r = httpx.post(url + "/v1/chat/completions", timeout=60, headers={"X-Request-Id": rid},
                           json={"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 24,
                                 "temperature": 0, "spec_pool": "code"})
            assert r.status_code == 200
            spec = r.json()["speculative"]
            arms[rid] = "plain" if spec["policy_reason"] == "rollout: plain arm" else "spec"
            assert arms[rid] == rollout_arm(rid, 0.5)
            if arms[rid] == "plain":
                assert spec["method"] == "none"
            else:
                assert spec["policy_reason"] and spec["method"] in ("none", "ngram", "draft", "suffix")
                assert 0 <= spec["lookup_steps"] <= spec["draft_steps"] <= spec["target_forwards"]
        assert 0 < list(arms.values()).count("plain") < 16
        status = httpx.get(url + "/v1/speculative/status").json()
        assert status["default"]["method"] == "auto" and status["traffic_fraction"] == 0.5
        assert "code" in {p["pool"] for p in status["policy"]["pools"]}
        assert status["policy"]["cost_model"]["verify"][0] == 1.0
        text = httpx.get(url + "/metrics").text
        code = next(p for p in status["policy"]["pools"] if p["pool"] == "code")
        # random tiny models accept little: the pool may already have fallen back; the gauge says which
        flag = "1.0" if code["enabled"] else "0.0"
        assert f'specdec:spec_decode_pool_enabled{{model_name="tiny",pool="code"}} {flag}' in text
        assert _metric(url, "specdec:rollout_requests_total", 'arm="plain"') == list(arms.values()).count("plain")
        r = _post(url, {"messages": MSG, "speculative": {"method": "auto", "num_speculative_tokens": 3}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "speculative.num_speculative_tokens"


def test_models_load_measure_and_step_on_one_thread(tiny_dirs, monkeypatch):
    """Every torch call of a served engine runs on its compute thread: libgomp gives each thread that runs a
    parallel region a team of its own, and with more teams than cores it stops spinning, so steps run beside the
    loading thread's team paid a futex wake-up per parallel region."""
    from specdec.cli import build_parser
    from specdec.engine import LLMEngine
    from specdec.llm import LLM
    from specdec.server.app import create_app
    from specdec.server.launch import build_engine, server_state

    seen: dict[str, set] = {"load": set(), "measure": set(), "step": set()}
    init, measure, step = LLM.__init__, LLM.cost_model, LLMEngine.step

    def record(kind, fn):
        def wrapped(*a, **kw):
            seen[kind].add(threading.get_ident())
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(LLM, "__init__", record("load", init))
    monkeypatch.setattr(LLM, "cost_model", record("measure", measure))     # measured, or read from the cache
    monkeypatch.setattr(LLMEngine, "step", record("step", step))
    args = build_parser().parse_args(["serve", "--target", str(tiny_dirs["target"]), "--dtype", "float32",
                                      "--draft", str(tiny_dirs["draft"]), "--served-model-name", "tiny"])
    engine, name = build_engine(args)
    from fastapi.testclient import TestClient

    with TestClient(create_app(server_state(engine, name, args))) as http:
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "def add(a, b):"}],
                                                    "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
    assert len(seen["load"]) == 1 and seen["load"] == seen["measure"] == seen["step"], seen
    assert threading.get_ident() not in seen["load"]


def test_every_method_the_status_lists_answers_per_request_as_plain_decoding(tiny_dirs, tiny_models, tmp_path):
    """/v1/speculative/status lists the methods this server runs, each with its status section; each answers a
    per-request override with 200 and the same greedy text as method none (suffix and the heads included); a
    declared method it does not run, and an unknown one, are 400 naming the parameter."""
    from test_heads import _eagle3, _medusa

    from specdec import LLM
    from specdec.models.heads import save_head, target_fingerprint

    target, _ = tiny_models
    save_head(_eagle3(target.model), "eagle3", tmp_path / "e3",
              {"specdec_target_fingerprint": target_fingerprint(target.model)})
    save_head(_medusa(target.model, truncated=150), "medusa", tmp_path / "med")
    llm = LLM(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype="float32", device="cpu",
              speculative=SpeculativeConfig(method="auto"), progress=False,
              heads={"eagle3": str(tmp_path / "e3"), "medusa": str(tmp_path / "med")})
    with running_server(llm, llm.speculative) as (url, _):
        listed = httpx.get(url + "/v1/speculative/status", timeout=10).json()["methods"]
        assert [m["method"] for m in listed] == ["none", "ngram", "suffix", "draft", "hybrid", "eagle3", "medusa",
                                                 "predicted_outputs", "auto"]
        assert all({"kind", "default_k", "tree", "origin", "status"} <= set(m) for m in listed)
        texts = {}
        for m in listed:
            body = {"messages": MSG, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                    "speculative": {"method": m["method"]}, "spec_pool": "code"}
            r = _post(url, body)
            assert r.status_code == 200, (m["method"], r.text)
            texts[m["method"]] = r.json()["choices"][0]["message"]["content"]
            if m["kind"] != "policy":
                assert r.json()["speculative"]["method"] == m["method"]
        assert all(t == texts["none"] for t in texts.values()), texts
        suffix = next(m for m in httpx.get(url + "/v1/speculative/status", timeout=10).json()["methods"]
                      if m["method"] == "suffix")
        assert suffix["status"]["pools"] >= 1 and suffix["status"]["tokens"] > 0     # it learned the answers
        for method, says in (("eagle", "needs its head loaded"), ("lookahead", "unknown speculative method")):
            r = _post(url, {"messages": MSG, "speculative": {"method": method}})
            assert r.status_code == 400 and r.json()["error"]["param"].startswith("speculative"), r.text
            assert says in r.json()["error"]["message"]


def _members(protocol) -> set[str]:
    return {n for n in (*vars(protocol), *protocol.__annotations__) if not n.startswith("_")}


def test_the_app_talks_to_one_engine_client_interface_both_servers_implement(server):
    """The HTTP layer's `engine` is an EngineClient: the single-process AsyncEngine and the Ray Serve client in
    front of replicas both have every member (read statically: the Ray client's properties ask Ray)."""
    import inspect

    from specdec.server.async_engine import RequestHandle
    from specdec.server.engine_client import EngineClient, RequestStream
    from specdec.server.ray_client import Accepted, RayEngineClient, RemoteHandle

    _, state = server
    assert isinstance(state.engine, EngineClient)

    class FakeServeHandle:
        def options(self, **kwargs):
            return self

    ray_client = RayEngineClient(FakeServeHandle(), state.engine.default_spec, 4)
    remote = RemoteHandle(None, Accepted("r1", 1), ray_client)
    local = RequestHandle("r", [1], None, state.engine.default_spec, asyncio.new_event_loop())
    for protocol, objects in ((EngineClient, (state.engine, ray_client)), (RequestStream, (local, remote))):
        members = _members(protocol)
        assert len(members) >= (15 if protocol is EngineClient else 3)
        for obj in objects:
            missing = []
            for name in members:
                try:
                    inspect.getattr_static(obj, name)
                except AttributeError:
                    missing.append(name)
            assert not missing, (type(obj).__name__, missing)
