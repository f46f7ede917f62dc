"""`specdec serve --replicas N` on Ray Serve: two engine replicas of the tiny pair behind one endpoint.

The cluster is started with docs/ray-serve.md's multi-node commands on a local head (`ray start --head`, then
`specdec serve --ray-address ...`); a second server starts its own local Ray for back-pressure and the fault test.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import make_tiny_model
from server_utils import free_port, server_process

SPEC = '{"method": "draft", "num_speculative_tokens": 3}'
CHAT = {"messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 12, "temperature": 0}


# -- pieces, without a cluster -------------------------------------------------------------------------------------
def test_rendezvous_moves_only_the_pools_of_a_lost_replica():
    from specdec.server.ray_router import rendezvous_order

    tags = [f"pool-{i}" for i in range(200)]
    three = {t: rendezvous_order(t, ["a", "b", "c"])[0] for t in tags}
    assert three == {t: rendezvous_order(t, ["c", "a", "b"])[0] for t in tags}      # order of ids does not matter
    assert {"a", "b", "c"} == set(three.values())
    two = {t: rendezvous_order(t, ["a", "b"])[0] for t in tags}
    assert all(two[t] == three[t] for t in tags if three[t] != "c")                # only c's pools move


def test_replica_metrics_merge_under_one_family_each():
    from prometheus_client.parser import text_string_to_metric_families

    from specdec.server.metrics import ServerMetrics, merge_labelled

    a, b = ServerMetrics("m"), ServerMetrics("m")
    a.rejected.inc()
    b.rejected.inc(3)
    a.ttft.observe(0.3)
    text = merge_labelled({"r1": a.render(), "r2": b.render()}).decode()
    fams = list(text_string_to_metric_families(text))
    assert len({f.name for f in fams}) == len(fams) == len(list(text_string_to_metric_families(a.render().decode())))
    got = {s.labels["replica"]: s.value for f in fams for s in f.samples if s.name == "specdec:request_rejected_total"}
    assert got == {"r1": 1.0, "r2": 3.0}
    count = {s.labels["replica"]: s.value for f in fams for s in f.samples
             if s.name == "specdec:time_to_first_token_seconds_count"}
    assert count == {"r1": 1.0, "r2": 0.0}


def test_autoscaling_config_is_checked_before_ray_starts():
    from specdec.errors import SpecDecError
    from specdec.server.ray_serve import autoscaling_config

    assert autoscaling_config(None, 2) is None
    cfg = autoscaling_config('{"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 3}', 2)
    assert cfg == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 3, "initial_replicas": 2}
    for bad, why in (('{"max_replica": 2}', "unknown key 'max_replica'"),
                     ('{"min_replicas": 3, "max_replicas": 2}', "must be greater than or equal to min_replicas"),
                     ('{"max_replicas": 0}', "max_replicas: Input should be greater than 0"),
                     ("[1]", "must be a JSON object")):
        with pytest.raises(SpecDecError, match="autoscaling-config") as err:
            autoscaling_config(bad, 1)
        assert why in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("flags,message", [
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--replicas", "2", "--autoscaling-config", '{"max_replica": 2}'], "unknown key 'max_replica'"),
])
def test_bad_replica_flags_fail_in_one_line(flags, message, tiny_dirs):
    out = subprocess.run([sys.executable, "-m", "specdec.cli", "serve", "--target", str(tiny_dirs["target"]), *flags],
                         capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert lines[0].startswith("specdec: error: ") and message in lines[0], out.stderr


def test_tokenizer_pickles_whole(tiny_models):
    import pickle

    tok = tiny_models[0].tokenizer
    copy = pickle.loads(pickle.dumps(tok))
    msgs = [{"role": "user", "content": "def add(a, b): 你好"}]
    assert copy.encode_chat(msgs) == tok.encode_chat(msgs) and copy.eos_token_ids == tok.eos_token_ids
    assert copy.decode(tok.encode("return a + b")) == "return a + b"


def _ray_bin() -> str:
    path = Path(sys.executable).parent / "ray"
    return str(path) if path.exists() else shutil.which("ray")


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory):
    """The tiny pair with a 4096-token window (a stream long enough to kill a replica in the middle of it)."""
    base = tmp_path_factory.mktemp("tiny-long")
    return {"target": make_tiny_model(base / "target", seed=0, max_position_embeddings=4096),
            "draft": make_tiny_model(base / "draft", seed=1, num_hidden_layers=1, max_position_embeddings=4096)}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Child processes (and Ray's workers, through the driver's runtime env) convert into a private cache."""
    old = dict(os.environ)
    os.environ["SPECDEC_CACHE"] = str(tmp_path_factory.mktemp("ray-cache"))
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    yield
    os.environ.clear()
    os.environ.update(old)


def _model_args(pair) -> list[str]:
    return ["--target", str(pair["target"]), "--draft", str(pair["draft"]), "--dtype", "float32",
            "--speculative-config", SPEC]


@pytest.fixture(scope="module")
def head(env, tmp_path_factory):
    """docs/ray-serve.md: `ray start --head --port=6379` on the head node (here with a free port), `ray stop` after."""
    port = free_port()
    out = subprocess.run([_ray_bin(), "start", "--head", f"--port={port}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    yield f"127.0.0.1:{port}"
    subprocess.run([_ray_bin(), "stop", "--force"], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def cluster_server(head, long_pair, tmp_path_factory):
    """docs/ray-serve.md: `specdec serve --ray-address HEAD:6379 --replicas 2` joins the running cluster."""
    log = tmp_path_factory.mktemp("ray-serve") / "serve.log"
    with server_process([*_model_args(long_pair), "--ray-address", head, "--replicas", "2"], log) as (proc, url):
        yield proc, url, log
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _status(url) -> dict:
    return httpx.get(url + "/v1/speculative/status", timeout=10).json()


def _wait(pred, timeout=60.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _metric(text: str, name: str) -> dict[str, float]:
    """replica label -> value, summed over the other labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[s.labels.get("replica")] = out.get(s.labels.get("replica"), 0.0) + s.value
    return out


def test_two_replicas_serve_a_benchmark_identical_to_one_process(cluster_server, long_pair, tmp_path):
    from specdec.bench.serve import ServeBenchConfig, run_serve_bench

    _, url, _ = cluster_server
    with server_process(_model_args(long_pair), tmp_path / "single.log") as (_, single):
        result = run_serve_bench(ServeBenchConfig(endpoints=[single, url], labels=["one", "ray"], concurrency=[4],
                                                  max_tokens=16, dataset="builtin", out=str(tmp_path / "bench")),
                                 progress=False)
    rows = {r["endpoint"]: r for r in result["summary"]}
    assert rows["ray"]["errors"] == 0 and rows["ray"]["completed"] == rows["one"]["completed"] > 0
    assert rows["ray"]["identical_to_first"] == 1.0
    # both replicas decoded part of it, and /metrics says so per replica, under the single-process names
    # (each replica reports once a second: wait until the reports cover every request, the warm-up one too)
    def counted():
        d = _metric(httpx.get(url + "/metrics", timeout=10).text, "specdec:request_success_total")
        served = [v for k, v in d.items() if k != "ingress"]
        return d if len(served) == 2 and min(served) > 0 and sum(served) >= rows["ray"]["completed"] + 1 else None

    _wait(counted, what="per-replica counters covering every request, from 2 replicas")
    status = _status(url)["policy"]["replicas"]
    assert len(status) == 2 and all(r["alive"] for r in status.values())


def test_a_spec_pool_sticks_to_one_replica(cluster_server):
    _, url, _ = cluster_server
    seen = {tag: set() for tag in ("alpha", "beta", "gamma", "delta")}
    for _ in range(3):
        for tag in seen:
            r = httpx.post(url + "/v1/chat/completions", json=CHAT | {"spec_pool": tag}, timeout=60)
            assert r.status_code == 200, r.text
            seen[tag].add(r.headers["x-specdec-replica"])
    assert all(len(v) == 1 for v in seen.values()), seen          # sequential: the preferred replica is always free
    pools = _status(url)["policy"]["routing"]["pools"]
    assert {t: pools[t] for t in seen} == {t: next(iter(v)) for t, v in seen.items()}


def test_errors_and_sse_match_the_single_process_server(cluster_server):
    _, url, _ = cluster_server
    bad = httpx.post(url + "/v1/chat/completions", json={"messages": []}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(url + "/v1/chat/completions", json=CHAT | {"model": "nope"}, timeout=30).status_code == 404
    with httpx.stream("POST", url + "/v1/chat/completions", json=CHAT | {"stream": True}, timeout=60) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_the_live_page_reads_every_replica_on_the_ingress(cluster_server):
    """/dashboard on the Ray ingress: its data counts what all replicas generated (the merged /metrics)."""
    import time

    _, url, _ = cluster_server
    assert httpx.get(url + "/dashboard", timeout=30).status_code == 200
    for tag in ("alpha", "beta", "gamma", "delta"):                  # pools spread over both replicas
        assert httpx.post(url + "/v1/chat/completions", json=CHAT | {"spec_pool": tag}, timeout=60).status_code == 200
    time.sleep(2.5)
    d = httpx.get(url + "/v1/dashboard/data?seconds=120&step=1", timeout=30).json()
    assert sum(d["tokens_per_s"]) > 0
    assert d["totals"] == _status(url)["speculation"]


# -- back-pressure and faults: a server with one running and one queued request per replica ------------------------
@pytest.fixture(scope="module")
def tight_server(cluster_server, long_pair, tmp_path_factory):
    """A local Ray of its own (no --ray-address), started after the cluster test's server is gone."""
    proc, _, _ = cluster_server
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    subprocess.run([_ray_bin(), "stop", "--force"], capture_output=True, timeout=120)
    log = tmp_path_factory.mktemp("ray-tight") / "serve.log"
    scaling = {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
               "upscale_delay_s": 0, "downscale_delay_s": 600, "metrics_interval_s": 0.5, "look_back_period_s": 1}
    args = [*_model_args(long_pair), "--autoscaling-config", json.dumps(scaling), "--threads", "1",
            "--max-num-seqs", "1", "--max-queued", "1"]
    with server_process(args, log) as (proc, url):
        yield url, log
        proc.send_signal(signal.SIGTERM)          # its own Ray goes down with it
        proc.wait(timeout=90)


def _open_stream(client: httpx.Client, url: str, max_tokens: int = 3000):
    body = CHAT | {"stream": True, "max_tokens": max_tokens, "temperature": 0.8, "seed": 1, "ignore_eos": True}
    resp = client.send(client.build_request("POST", url + "/v1/chat/completions", json=body), stream=True)
    return resp, resp.iter_lines()


def test_a_queued_request_scales_the_replicas_up(tight_server):
    import threading

    url, _ = tight_server
    _wait(lambda: len(_status(url)["policy"]["replicas"]) == 1, what="one replica reporting")
    with httpx.Client(timeout=180) as c1, httpx.Client(timeout=180) as c2:
        first, _ = _open_stream(c1, url)
        assert first.status_code == 200
        second = {}
        waiting = threading.Thread(target=lambda: second.update(r=_open_stream(c2, url)[0]), daemon=True)
        waiting.start()                     # no free slot: it waits in the router, the autoscaler adds a replica
        _wait(lambda: len(_status(url)["policy"]["replicas"]) == 2, timeout=120, what="a second replica")
        waiting.join(timeout=60)
        assert second["r"].status_code == 200
        assert second["r"].headers["x-specdec-replica"] != first.headers["x-specdec-replica"]
        first.close()
        second["r"].close()


def test_full_replicas_and_queue_answer_429_with_retry_after(tight_server):
    url, _ = tight_server
    with httpx.Client(timeout=120) as c1, httpx.Client(timeout=120) as c2:
        streams = [_open_stream(c, url) for c in (c1, c2)]     # one running on each replica
        assert all(r.status_code == 200 for r, _ in streams)
        assert {r.headers["x-specdec-replica"] for r, _ in streams} == set(_status(url)["policy"]["replicas"])
        with httpx.Client(timeout=120) as c3:
            queued = c3.build_request("POST", url + "/v1/chat/completions", json=CHAT)
            import threading

            waiting = threading.Thread(target=lambda: c3.send(queued), daemon=True)
            waiting.start()                                     # waits in the router's queue (--max-queued 1)
            time.sleep(1.0)
            r = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=30)
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "queue_full" and r.headers["retry-after"] == "1"
            for resp, _ in streams:
                resp.close()                                    # clients leave: their replicas free up
            waiting.join(timeout=60)
            assert not waiting.is_alive()
    m = _metric(httpx.get(url + "/metrics", timeout=10).text, "specdec:request_rejected_total")
    assert m.get("ingress", 0) >= 1


def test_a_replica_killed_mid_stream_ends_that_stream_with_an_error_and_is_restarted(tight_server):
    url, _ = tight_server
    before = _status(url)["policy"]["replicas"]
    with httpx.Client(timeout=120) as client:
        resp, lines = _open_stream(client, url)
        assert resp.status_code == 200
        victim = resp.headers["x-specdec-replica"]
        first = next(ln for ln in lines if ln.startswith("data: "))
        assert json.loads(first[6:])["choices"]
        os.kill(before[victim]["pid"], signal.SIGKILL)
        rest = [ln for ln in lines if ln.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    err = json.loads(rest[-2][6:])["error"]
    assert "replica" in err["message"] and err["type"] == "internal_error", err
    # new requests keep succeeding (one at a time on the survivor, and on the replacement once it is up)
    for _ in range(4):
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=120)
        assert r.status_code == 200, r.text
    # Ray Serve starts a replacement: two live replicas again, the killed one gone
    now = _wait(lambda: (lambda s: s if len(s) == 2 and victim not in s and all(v["alive"] for v in s.values())
                         else None)(_status(url)["policy"]["replicas"]), timeout=120, what="the replacement replica")
    assert set(now) - set(before)
    lost = _metric(httpx.get(url + "/metrics", timeout=10).text, "specdec:replica_lost_requests_total")
    assert lost.get("ingress") == 1.0
