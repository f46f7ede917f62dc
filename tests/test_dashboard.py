"""The live page: GET /dashboard (self-contained, shipped in the package) plots what /v1/dashboard/data serves,
which a sampler reads from the server's own /metrics once a second; behind the API key; off with a flag."""
import time

import httpx
import pytest
from browser_utils import browser, open_live_page

from specdec.config import SpeculativeConfig
from specdec.server.dashboard import LiveSeries, read_sample, totals

EXPOSITION = """# TYPE specdec:generation_tokens counter
specdec:generation_tokens_total{{model_name="m",replica="a"}} {tok}
specdec:generation_tokens_total{{model_name="m",replica="b"}} {tok}
# TYPE specdec:spec_decode_num_draft_tokens counter
specdec:spec_decode_num_draft_tokens_total{{model_name="m"}} {drafted}
# TYPE specdec:spec_decode_num_accepted_tokens counter
specdec:spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}
# TYPE specdec:spec_decode_num_drafts counter
specdec:spec_decode_num_drafts_total{{model_name="m"}} {drafts}
# TYPE specdec:spec_decode_pool_requests counter
specdec:spec_decode_pool_requests_total{{model_name="m",pool="code",method="ngram"}} {reqs}
"""


def test_window_rates_from_counters():
    state = {"tok": 0, "drafted": 0, "accepted": 0, "drafts": 0, "reqs": 0}
    live = LiveSeries(lambda: EXPOSITION.format(**state), every_s=1.0)
    t0 = time.time() - 10
    for i in range(6):
        live.samples.append((t0 + 2 * i, read_sample(EXPOSITION.format(**state))))
        state = {"tok": state["tok"] + 20, "drafted": state["drafted"] + 10, "accepted": state["accepted"] + 6,
                 "drafts": state["drafts"] + 3, "reqs": state["reqs"] + 1}
    d = live.window(300, 2)
    assert len(d["t"]) == 5
    assert d["tokens_per_s"] == pytest.approx([20.0] * 5)                 # 2 replicas x 20 tokens in 2 s
    assert d["acceptance"] == pytest.approx([0.6] * 5) and d["accepted_length"] == pytest.approx([3.0] * 5)
    assert d["methods"]["code/ngram"] == pytest.approx([0.5] * 5)
    assert d["totals"] == totals(live.samples[-1][1]) and d["totals"]["acceptance_rate"] == pytest.approx(0.6)


def test_a_sample_reads_only_its_lines_and_the_same_values():
    """The sampler keeps the few samples it plots before parsing (the whole exposition, histograms and per-position
    counters included, took ~2.4 ms of Python a second beside the engine): the values are those of a full parse."""
    from prometheus_client.parser import text_string_to_metric_families

    from specdec.server import dashboard
    from specdec.server.metrics import ServerMetrics

    m = ServerMetrics("m")
    m.drafts.inc(3), m.draft_tokens.inc(12), m.accepted_tokens.inc(7), m.generation_tokens.inc(40)
    m.observe_first_token(0.5), m.observe_first_token(0.25)
    m.observe_token_gap(0.02)
    text = m.render().decode() + EXPOSITION.format(tok=5, drafted=4, accepted=2, drafts=1, reqs=3)
    kept = dashboard.wanted_lines(text)
    assert len(kept) < len(text) / 5 and "_bucket" not in kept and "accepted_tokens_per_pos" not in kept
    full = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in dashboard.SAMPLES:
                full.setdefault(s.name, []).append(s.value)
    got = read_sample(text)
    assert got["tokens"] == sum(full["specdec:generation_tokens_total"]) == 50
    assert (got["draft_tokens"], got["accepted"], got["drafts"]) == (16, 9, 4)
    assert (got["ttft_sum"], got["ttft_count"]) == (0.75, 2) and got["methods"] == {"code/ngram": 3}


@pytest.fixture(scope="module")
def keyed_server(tiny_dirs):
    from server_utils import draft_llm, running_server

    llm = draft_llm(tiny_dirs)
    with running_server(llm, SpeculativeConfig(method="draft", num_speculative_tokens=3), api_key="k") as s:
        yield s


def test_page_and_data_behind_the_key(keyed_server):
    url, _ = keyed_server
    auth = {"Authorization": "Bearer k"}
    html = httpx.get(url + "/dashboard", timeout=10)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert 'id="acceptance"' in html.text and "<script" in html.text and "http" not in html.text.split("<script")[1]
    assert httpx.get(url + "/v1/dashboard/data", timeout=10).status_code == 401
    body = {"model": "tiny", "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 24,
            "temperature": 0, "ignore_eos": True}
    for _ in range(3):
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=auth, timeout=60).status_code == 200
        time.sleep(1.2)                                          # the sampler reads once a second
    time.sleep(1.2)
    d = httpx.get(url + "/v1/dashboard/data?seconds=60&step=1", headers=auth, timeout=10).json()
    assert len(d["t"]) >= 3 and max(d["tokens_per_s"]) > 0
    assert any(v is not None and 0 <= v <= 1 for v in d["acceptance"])
    assert all(v is None or 1 <= v <= 4 for v in d["accepted_length"])     # k = 3: at most k + 1
    status = httpx.get(url + "/v1/speculative/status", headers=auth, timeout=10).json()["speculation"]
    assert status["draft_tokens"] > 0 and d["totals"] == status
    for query, param in (("seconds=abc", "seconds"), ("step=0", "step"), ("seconds=100000", "seconds"),
                         ("bogus=1", "bogus")):
        r = httpx.get(url + "/v1/dashboard/data?" + query, headers=auth, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (query, r.text)


def test_no_dashboard_flag(tiny_dirs):
    from server_utils import draft_llm

    from specdec.cli_args import build_parser
    from specdec.server.app import create_app
    from specdec.server.async_engine import AsyncEngine
    from specdec.server.launch import server_state
    from specdec.server.metrics import ServerMetrics

    engine = AsyncEngine(draft_llm(tiny_dirs), SpeculativeConfig(method="none"), 4, ServerMetrics("tiny"))
    for flags, shown in (([], True), (["--no-dashboard"], False)):
        state = server_state(engine, "tiny", build_parser().parse_args(["serve", *flags]))
        paths = {r.path for r in create_app(state).routes}
        assert ("/dashboard" in paths) == shown and ("/v1/dashboard/data" in paths) == shown and "/metrics" in paths


def test_a_browser_draws_the_live_page(keyed_server, tmp_path):
    url, _ = keyed_server
    auth = {"Authorization": "Bearer k"}
    driver = browser()
    try:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "class Cache:"}], "max_tokens": 24,
                "temperature": 0, "ignore_eos": True}
        for _ in range(2):
            assert httpx.post(url + "/v1/chat/completions", json=body, headers=auth, timeout=60).status_code == 200
            time.sleep(1.2)
        time.sleep(1.2)                                          # the last request's counters sampled
        shown = open_live_page(driver, url, "k")
        status = httpx.get(url + "/v1/speculative/status", headers=auth, timeout=10).json()["speculation"]
        assert shown["acceptance_total"] == pytest.approx(status["acceptance_rate"], abs=1e-9)
        assert shown["acceptance"] and 0 <= float(shown["acceptance"]) <= 1
        driver.save_screenshot(str(tmp_path / "dashboard.png"))
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    finally:
        driver.quit()
