"""monitoring/: the dashboards and rules are current with their generator, name only metrics /metrics exports,
and the rules pass promtool's check and unit tests (Debian's `prometheus` package brings promtool)."""
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

MON = Path(__file__).resolve().parent.parent / "monitoring"


def _generator():
    spec = importlib.util.spec_from_file_location("monitoring_generate", MON / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_files_are_current_and_name_exported_metrics():
    gen = _generator()
    assert gen.main(["--check"]) == 0
    assert gen.unknown_metrics(gen.expressions()) == []
    # the check is real: a metric the server does not export, and a stale file, fail it
    assert gen.unknown_metrics(["rate(specdec:spec_decode_num_drafts_total[5m])",
                                "rate(specdec:no_such_metric_total[5m])"]) == ["specdec:no_such_metric_total"]
    exported = gen.exported_series()
    assert {"specdec:inter_token_latency_seconds_bucket", "specdec:kv_cache_usage_perc",
            "specdec:num_preemptions_total", "specdec:spec_decode_pool_num_accepted_tokens_total",
            "process_resident_memory_bytes"} <= exported


def test_a_stale_file_fails_the_check(tmp_path, monkeypatch):
    gen = _generator()
    shutil.copytree(MON, tmp_path / "monitoring")
    monkeypatch.setattr(gen, "HERE", tmp_path / "monitoring")
    rules = tmp_path / "monitoring" / "prometheus" / "specdec-rules.yml"
    rules.write_text(rules.read_text().replace("< 0.3", "< 0.2"))
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


def test_rules_pass_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for args in (["check", "rules", "specdec-rules.yml"], ["test", "rules", "specdec-rules_test.yml"],
                 ["check", "config", "prometheus.yml"]):
        out = subprocess.run([promtool, *args], cwd=MON / "prometheus", capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr


# Panels in the form of vLLM's published Grafana dashboard (examples/observability), over vLLM's metric names
VLLM_PANELS = [
    'histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}'
    '[$__rate_interval])))',
    'histogram_quantile(0.5, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}'
    '[$__rate_interval])))',
    'histogram_quantile(0.9, sum by(le) (rate(vllm:time_per_output_token_seconds_bucket{model_name="$model_name"}'
    '[$__rate_interval])))',
    'rate(vllm:prompt_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:generation_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'vllm:num_requests_running{model_name="$model_name"}',
    'vllm:num_requests_waiting{model_name="$model_name"}',
    'vllm:kv_cache_usage_perc{model_name="$model_name"}',
    'sum by(finished_reason) (increase(vllm:request_success_total{model_name="$model_name"}[$__rate_interval]))',
    'rate(vllm:spec_decode_num_accepted_tokens_total{model_name="$model_name"}[$__rate_interval]) / '
    'rate(vllm:spec_decode_num_draft_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:prefix_cache_hits_total{model_name="$model_name"}[$__rate_interval]) / '
    'rate(vllm:prefix_cache_queries_total{model_name="$model_name"}[$__rate_interval])',
]


def test_vllm_names_answer_vllm_panels(tiny_dirs, tmp_path):
    """--export-vllm-metrics: vLLM's dashboard expressions, evaluated by promtool over two real scrapes of the
    server's /metrics, each return data (a recorded panel that is absent fires an alert the test forbids)."""
    import httpx
    import yaml
    from prometheus_client.parser import text_string_to_metric_families
    from server_utils import draft_llm, running_server

    from specdec.config import SpeculativeConfig

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    with running_server(draft_llm(tiny_dirs), SpeculativeConfig(method="draft", num_speculative_tokens=3)) as (url, st):
        st.vllm_metrics = True
        before = httpx.get(url + "/metrics", timeout=10).text
        body = {"model": "tiny", "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 16,
                "temperature": 0, "ignore_eos": True}
        for _ in range(3):
            assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        after = httpx.get(url + "/metrics", timeout=10).text
        st.vllm_metrics = False
        assert "vllm:" not in httpx.get(url + "/metrics", timeout=10).text          # off: specdec's names only

    def samples(text):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name.startswith("vllm:") and not s.name.endswith("_created")}

    v0, v1 = samples(before), samples(after)
    assert v1 and all(dict(labels).get("engine") == "0" for _, labels in v1)
    series = [{"series": name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in labels) + "}",
               "values": f"{v0.get((name, labels), 0)} {v} {v} {v}"} for (name, labels), v in v1.items()]
    panels = [e.replace("$model_name", "tiny").replace("$__rate_interval", "1m") for e in VLLM_PANELS]
    rules = {"groups": [{"name": "panels", "rules": [r for i, e in enumerate(panels) for r in (
        {"record": f"panel_{i}", "expr": e}, {"alert": f"PanelEmpty{i}", "expr": f"absent(panel_{i})"})]}]}
    (tmp_path / "panels.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["panels.yml"], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series,
                   "alert_rule_test": [{"eval_time": "45s", "alertname": f"PanelEmpty{i}", "exp_alerts": []}
                                       for i in range(len(panels))]}]}))
    out = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


WORDS = ("apple river stone cloud house water light green seven table horse music paper night bread glass chair "
         "money doctor garden winter summer window market silver yellow forest orange planet letter bottle "
         "mountain island pencil rabbit").split()


@pytest.mark.real_models
def test_a_real_prometheus_evaluates_every_panel_and_rule(tmp_path):
    """A Prometheus on loopback scrapes a live server on the real pair (int4, as `specdec serve` runs it) every
    second while it serves a little traffic: method auto in one pool on a copy-heavy edit; prompt lookup in another
    on shuffled words the model is asked to translate (the lookup proposes the prompt's English continuations, the
    model writes French: it accepts badly). Every dashboard panel's expression and every recording rule returns
    data through Prometheus's HTTP API, acceptance within [0, 1] and accepted length within [1, k + 1]; the
    low-acceptance alert goes pending for the translation pool and for no other.

    auto is given a cost model (speculation priced as on an AVX-512 CPU) instead of measuring one at start, which
    takes over a minute on a fresh 2-core AVX2 machine: what auto picks here is not what is tested
    (tests/test_policy.py measures a cost model and checks the choices)."""
    import math
    import random
    import time

    import httpx
    import yaml
    from server_utils import free_port, running_server

    from specdec import LLM
    from specdec.config import SpeculativeConfig
    from specdec.policy import CostModel

    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    gen = _generator()
    # the rules as shipped, evaluated every second and over 30 s instead of 5 min (seconds of traffic here: a rate
    # over 5 min would spread them over the whole range, below the alert's floor of one draft token a second)
    rules = yaml.safe_load((MON / "prometheus" / "specdec-rules.yml").read_text().replace("[5m]", "[30s]"))
    for group in rules["groups"]:
        group.pop("interval", None)
    (tmp_path / "specdec-rules.yml").write_text(yaml.safe_dump(rules))
    llm = LLM(speculative=SpeculativeConfig(method="auto"), quantization="int4", progress=False)
    llm.policy(cost=CostModel(draft_step=0.4, verify=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16],
                              lookup=0.01))
    with running_server(llm, SpeculativeConfig(method="auto"), name="qwen") as (url, _):
        port = free_port()
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": ["specdec-rules.yml"],
            "scrape_configs": [{"job_name": "specdec", "static_configs": [{"targets": [url.split("//")[1]]}]}]}))
        prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        api = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    if httpx.get(api + "/-/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            rng = random.Random(0)
            edit = ("Add type hints to this function and change nothing else:\n\ndef mean(xs):\n    total = 0\n"
                    "    for x in xs:\n        total += x\n    return total / len(xs)\n")
            t_end = time.time() + 15
            while time.time() < t_end:
                words = " ".join(rng.sample(WORDS, len(WORDS)))     # each once: no pair of them repeats
                for pool, method, text in (("code", None, edit),
                                           ("noise", "ngram", f"Translate each of these words into French: {words}")):
                    body = {"model": "qwen", "messages": [{"role": "user", "content": text}], "max_tokens": 24,
                            "temperature": 0, "ignore_eos": True, "spec_pool": pool,
                            **({"speculative": {"method": method, "num_speculative_tokens": 4}} if method else {})}
                    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=120).status_code == 200
            time.sleep(3)                                        # a few more scrapes and rule evaluations

            def query(expr):
                r = httpx.get(api + "/api/v1/query", params={"query": expr}, timeout=10).json()
                assert r["status"] == "success", (expr, r)
                return [float(s["value"][1]) for s in r["data"]["result"]]

            subst = {"$job": ".*", "$instance": ".*", "$model_name": ".*", "$__rate_interval": "40s"}
            for title, _, targets in gen.SPECULATIVE + gen.SERVING:
                for legend, expr in targets:
                    for k, v in subst.items():
                        expr = expr.replace(k, v)
                    values = query(expr)
                    assert values, (title, legend, expr)
                    finite = [v for v in values if not math.isnan(v)]
                    if title.startswith("Acceptance"):
                        assert finite and all(0 <= v <= 1 for v in finite), (title, values)
                    if title.startswith("Mean accepted length"):
                        assert finite and all(1 <= v <= 9 for v in finite), (title, values)       # k <= 8
            for group in gen.rules()["groups"]:
                for rule in group["rules"]:
                    if "record" in rule:
                        assert query(rule["record"]), rule["record"]
            alerts = httpx.get(api + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            low = [a for a in alerts if a["labels"]["alertname"] == "SpecDecodeAcceptanceLow"]
            rates = [(r["metric"]["pool"], r["metric"]["method"], r["value"][1]) for r in httpx.get(
                api + "/api/v1/query", params={"query": "specdec:pool_acceptance_rate:rate5m"},
                timeout=10).json()["data"]["result"]]
            assert {a["labels"]["pool"] for a in low} == {"noise"}, rates
            assert low[0]["state"] in ("pending", "firing")
        finally:
            prom.terminate()
            prom.wait(timeout=30)
