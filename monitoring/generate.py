"""Generate specdec's Grafana dashboards and Prometheus rules from one table of PromQL (vLLM generates its dashboards
from Python the same way). `--check` regenerates in memory and fails when a file here is stale or an expression names
a metric that specdec's /metrics does not export.

    python monitoring/generate.py            # write the files
    python monitoring/generate.py --check    # exit 1 if stale or naming an unknown metric
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEL = '{job=~"$job", instance=~"$instance", model_name=~"$model_name"}'
RI = "[$__rate_interval]"
BY = "job, instance, model_name"

# alert thresholds (monitoring/README.md says why each)
ACCEPTANCE_LOW = 0.3            # a pool/method accepting under 30% of its draft tokens costs more than it saves
TTFT_P99_S = 10.0
ITL_P99_S = 1.0
WAITING_MAX = 16
FAILED_RATIO = 0.05


def rate(metric: str, by: str = "", sel: str = SEL, window: str = RI) -> str:
    inner = f"rate({metric}{sel}{window})"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantile(q: float, hist: str, by: str = "le") -> str:
    return f"histogram_quantile({q}, sum by ({by}) (rate({hist}_bucket{SEL}{RI})))"


ACC, DRAFT, DRAFTS = ("specdec:spec_decode_num_accepted_tokens_total", "specdec:spec_decode_num_draft_tokens_total",
                      "specdec:spec_decode_num_drafts_total")
DRAFT_S, VERIFY_S = "specdec:spec_decode_draft_time_seconds_total", "specdec:spec_decode_verify_time_seconds_total"
P_ACC, P_DRAFT, P_REQ = ("specdec:spec_decode_pool_num_accepted_tokens_total",
                         "specdec:spec_decode_pool_num_draft_tokens_total", "specdec:spec_decode_pool_requests_total")

# (title, unit, [(legend, expr)]) per panel
SPECULATIVE = [
    ("Acceptance rate", "percentunit", [("accepted / drafted", f"{rate(ACC)} / {rate(DRAFT)}")]),
    ("Mean accepted length (tokens per verification, bonus included)", "none",
     [("mean accepted length", f"1 + {rate(ACC)} / {rate(DRAFTS)}")]),
    ("Acceptance per draft position", "percentunit",
     [("position {{position}}", f"{rate('specdec:spec_decode_num_accepted_tokens_per_pos_total', 'position')} "
                                f"/ ignoring(position) group_left {rate(DRAFTS)}")]),
    ("Draft token flow", "short", [("drafted", rate(DRAFT)), ("accepted", rate(ACC)),
                                   ("rejected", f"{rate(DRAFT)} - {rate(ACC)}")]),
    ("Share of output tokens that came from drafts", "percentunit",
     [("accepted / generated", f"{rate(ACC)} / {rate('specdec:generation_tokens_total')}")]),
    ("Acceptance per pool and method", "percentunit",
     [("{{pool}} {{method}}", f"{rate(P_ACC, 'pool, method')} / {rate(P_DRAFT, 'pool, method')}")]),
    ("Method chosen per pool (finished requests/s)", "reqps",
     [("{{pool}} {{method}}", rate(P_REQ, "pool, method"))]),
    ("Pools speculating (0: fell back to plain decoding)", "none",
     [("{{pool}}", f"max by (pool) (specdec:spec_decode_pool_enabled{SEL})")]),
    ("Draft overhead (share of step time spent drafting)", "percentunit",
     [("draft", f"{rate(DRAFT_S)} / ({rate(DRAFT_S)} + {rate(VERIFY_S)})")]),
]
SERVING = [
    ("Time to first token", "s", [(f"P{int(q * 100)}", quantile(q, "specdec:time_to_first_token_seconds"))
                                  for q in (0.5, 0.95, 0.99)]),
    ("Inter-token latency", "s", [(f"P{int(q * 100)}", quantile(q, "specdec:inter_token_latency_seconds"))
                                  for q in (0.5, 0.95, 0.99)]),
    ("Time per output token", "s", [(f"P{int(q * 100)}", quantile(q, "specdec:time_per_output_token_seconds"))
                                    for q in (0.5, 0.95, 0.99)]),
    ("End-to-end latency", "s", [(f"P{int(q * 100)}", quantile(q, "specdec:e2e_request_latency_seconds"))
                                 for q in (0.5, 0.95, 0.99)]),
    ("Requests running and waiting", "short", [("running", f"sum(specdec:num_requests_running{SEL})"),
                                               ("waiting", f"sum(specdec:num_requests_waiting{SEL})")]),
    ("Tokens/s", "short", [("generated", rate("specdec:generation_tokens_total")),
                           ("prompt", rate("specdec:prompt_tokens_total"))]),
    ("Prefix cache hit rate (prompt tokens)", "percentunit",
     [("hits / queries", f"{rate('specdec:prefix_cache_hits_total')} / {rate('specdec:prefix_cache_queries_total')}")]),
    ("KV cache usage", "percentunit", [("{{instance}}", f"max by (instance) (specdec:kv_cache_usage_perc{SEL})")]),
    ("Preemptions/s", "short", [("preempted", rate("specdec:num_preemptions_total"))]),
    ("Refused (429), failed (500) and aborted requests/s", "reqps",
     [("429 queue full", rate("specdec:request_rejected_total")), ("failed", rate("specdec:request_failed_total")),
      ("aborted", rate("specdec:request_aborted_total"))]),
]


def dashboard(uid: str, title: str, panels: list) -> dict:
    variables = [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"}]
    for name, query in (("job", "label_values(specdec:num_requests_running, job)"),
                        ("instance", 'label_values(specdec:num_requests_running{job=~"$job"}, instance)'),
                        ("model_name", 'label_values(specdec:num_requests_running{job=~"$job"}, model_name)')):
        variables.append({"name": name, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
                          "query": {"query": query, "refId": name}, "definition": query, "refresh": 2,
                          "includeAll": True, "multi": True, "allValue": ".*",
                          "current": {"text": "All", "value": "$__all"}})
    out = []
    for i, (ptitle, unit, targets) in enumerate(panels):
        out.append({"id": i + 1, "type": "timeseries", "title": ptitle,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "targets": [{"refId": chr(65 + j), "expr": expr, "legendFormat": legend}
                                for j, (legend, expr) in enumerate(targets)]})
    return {"uid": uid, "title": title, "tags": ["specdec"], "timezone": "browser", "schemaVersion": 39,
            "version": 1, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
            "templating": {"list": variables}, "panels": out}


RB = "job, instance, model_name, pool, method"


def rules() -> dict:
    acc = "specdec:pool_acceptance_rate:rate5m"
    return {"groups": [
        {"name": "specdec-recording", "interval": "30s", "rules": [
            {"record": "specdec:acceptance_rate:rate5m",
             "expr": f"sum by ({BY}) (rate({ACC}[5m])) / sum by ({BY}) (rate({DRAFT}[5m]))"},
            {"record": "specdec:mean_accepted_length:rate5m",
             "expr": f"1 + sum by ({BY}) (rate({ACC}[5m])) / sum by ({BY}) (rate({DRAFTS}[5m]))"},
            {"record": acc, "expr": f"sum by ({RB}) (rate({P_ACC}[5m])) / sum by ({RB}) (rate({P_DRAFT}[5m]))"},
        ]},
        {"name": "specdec-alerts", "rules": [
            _alert("SpecDecodeAcceptanceLow",
                   f"{acc} < {ACCEPTANCE_LOW} and on ({RB}) sum by ({RB}) (rate({P_DRAFT}[5m])) > 1", "10m", "warning",
                   "Low draft acceptance in pool {{ $labels.pool }} (method {{ $labels.method }})",
                   "{{ $labels.instance }}: method {{ $labels.method }} in pool {{ $labels.pool }} has accepted "
                   "{{ $value | humanizePercentage }} of its draft tokens for 10 minutes."),
            _alert("SpecDecodeFallbackActive", "max by (job, instance, model_name, pool) "
                   "(specdec:spec_decode_pool_enabled) == 0", "5m", "info",
                   "Speculation is off in pool {{ $labels.pool }}",
                   "{{ $labels.instance }}: pool {{ $labels.pool }} fell back to plain decoding (speculation did not "
                   "pay there) and has stayed off for 5 minutes."),
            _alert("SpecdecTTFTHigh", f"histogram_quantile(0.99, sum by ({BY}, le) "
                   f"(rate(specdec:time_to_first_token_seconds_bucket[5m]))) > {TTFT_P99_S}", "5m", "warning",
                   f"TTFT P99 over {TTFT_P99_S:g} s",
                   "{{ $labels.instance }}: 99th percentile time to first token is {{ $value | humanizeDuration }}."),
            _alert("SpecdecITLHigh", f"histogram_quantile(0.99, sum by ({BY}, le) "
                   f"(rate(specdec:inter_token_latency_seconds_bucket[5m]))) > {ITL_P99_S}", "5m", "warning",
                   f"Inter-token latency P99 over {ITL_P99_S:g} s",
                   "{{ $labels.instance }}: 99th percentile gap between token deliveries is "
                   "{{ $value | humanizeDuration }}."),
            _alert("SpecdecQueueBacklog", f"sum by ({BY}) (specdec:num_requests_waiting) > {WAITING_MAX} or sum by "
                   f"({BY}) (rate(specdec:request_rejected_total[5m])) > 0", "5m", "warning",
                   "Requests are queueing or being refused",
                   "{{ $labels.instance }}: over " + str(WAITING_MAX) + " requests waiting, or 429s, for 5 minutes."),
            _alert("SpecdecRequestsFailing", f"sum by ({BY}) (rate(specdec:request_failed_total[5m])) / sum by ({BY}) "
                   f"(rate(specdec:request_success_total[5m]) + rate(specdec:request_failed_total[5m])) "
                   f"> {FAILED_RATIO}", "5m", "critical", "Requests are failing inside the engine",
                   "{{ $labels.instance }}: {{ $value | humanizePercentage }} of requests failed (HTTP 500) over "
                   "5 minutes."),
            _alert("SpecdecTargetDown", 'up{job=~"specdec.*"} == 0', "1m", "critical", "specdec is down",
                   "{{ $labels.instance }} has not answered Prometheus's scrapes for a minute."),
        ]},
    ]}


def _alert(name, expr, for_, severity, summary, description) -> dict:
    notes = {"summary": summary, "description": description, "runbook_url": f"monitoring/README.md#{name.lower()}"}
    return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity}, "annotations": notes}


def files() -> dict[str, str]:
    import yaml

    dump = lambda obj: yaml.safe_dump(obj, sort_keys=False, width=120)   # noqa: E731
    return {
        "grafana/dashboards/specdec-speculative.json": json.dumps(
            dashboard("specdec-spec", "specdec: speculative decoding", SPECULATIVE), indent=1) + "\n",
        "grafana/dashboards/specdec-serving.json": json.dumps(
            dashboard("specdec-serving", "specdec: serving", SERVING), indent=1) + "\n",
        "prometheus/specdec-rules.yml": "# generated by monitoring/generate.py: edit that, then run it\n"
                                        + dump(rules()),
    }


def expressions() -> list[str]:
    out = [e for _, _, targets in SPECULATIVE + SERVING for _, e in targets]
    out += [r["expr"] for g in rules()["groups"] for r in g["rules"]]
    return out


def exported_series() -> set[str]:
    """Every series name specdec's /metrics exports (counters' _total, histograms' _bucket/_sum/_count)."""
    from specdec.server.metrics import ServerMetrics

    names = set()
    for fam in ServerMetrics("x").registry.collect():
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
        names |= {fam.name + s for s in suffixes.get(fam.type, ("",))}
    return names


def unknown_metrics(exprs: list[str]) -> list[str]:
    """Metric names in the expressions that /metrics does not export (recorded rules and `up` aside)."""
    recorded = {r["record"] for g in rules()["groups"] for r in g["rules"] if "record" in r}
    known = exported_series() | recorded | {"up"}
    return sorted({m for e in exprs for m in re.findall(r"specdec:[A-Za-z0-9_:]+", e)} - known)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="fail if a file is stale or names an unknown metric")
    args = p.parse_args(argv)
    bad = unknown_metrics(expressions())
    if bad:
        print(f"monitoring: expressions name metrics /metrics does not export: {', '.join(bad)}", file=sys.stderr)
        return 1
    stale = []
    for rel, text in files().items():
        path = HERE / rel
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(rel)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"monitoring: stale (run python monitoring/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
