"""monitoring/: the dashboards and rules are current with their generator, name only metrics /metrics exports,
and the rules pass promtool's check and unit tests (Debian's `prometheus` package brings promtool)."""
import importlib.util
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
