"""Prometheus metrics, named like vLLM's (`vllm:` -> `specdec:`), on a registry of the server's own."""
from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
MAX_POSITIONS = 32


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)     # process_resident_memory_bytes, _cpu_seconds_total, ... (as vLLM exports)
        lbl = {"model_name": model_name}
        self._lbl = lbl
        names = ["model_name"]
        self.running = Gauge("specdec:num_requests_running", "Requests being decoded", names, registry=r).labels(**lbl)
        self.waiting = Gauge("specdec:num_requests_waiting", "Requests queued", names, registry=r).labels(**lbl)
        self.drafts = Counter("specdec:spec_decode_num_drafts", "Verification steps that checked a non-empty draft",
                              names, registry=r).labels(**lbl)
        self.draft_tokens = Counter("specdec:spec_decode_num_draft_tokens", "Draft tokens proposed", names,
                                    registry=r).labels(**lbl)
        self.accepted_tokens = Counter("specdec:spec_decode_num_accepted_tokens", "Draft tokens accepted", names,
                                       registry=r).labels(**lbl)
        self._per_pos = Counter("specdec:spec_decode_num_accepted_tokens_per_pos",
                                "Draft tokens accepted at each draft position (0-based)", names + ["position"],
                                registry=r)
        self.draft_time = Counter("specdec:spec_decode_draft_time_seconds", "Time spent drafting", names,
                                  registry=r).labels(**lbl)
        self.verify_time = Counter("specdec:spec_decode_verify_time_seconds", "Time spent in target forwards",
                                   names, registry=r).labels(**lbl)
        self.prompt_tokens = Counter("specdec:prompt_tokens", "Prompt tokens processed", names,
                                     registry=r).labels(**lbl)
        self.generation_tokens = Counter("specdec:generation_tokens", "Tokens generated", names,
                                         registry=r).labels(**lbl)
        self._success = Counter("specdec:request_success", "Finished requests", names + ["finished_reason"], registry=r)
        self.aborted = Counter("specdec:request_aborted", "Requests aborted (client gone or shutdown)", names,
                               registry=r).labels(**lbl)
        self.failed = Counter("specdec:request_failed", "Requests that failed inside the engine", names,
                              registry=r).labels(**lbl)
        self.rejected = Counter("specdec:request_rejected", "Requests refused with 429 (queue full)", names,
                                registry=r).labels(**lbl)
        self.ttft = Histogram("specdec:time_to_first_token_seconds", "Arrival to first token", names,
                              buckets=_LATENCY_BUCKETS, registry=r).labels(**lbl)
        self.tpot = Histogram("specdec:time_per_output_token_seconds", "Mean time per output token after the first",
                              names, buckets=_TPOT_BUCKETS, registry=r).labels(**lbl)
        self.e2e = Histogram("specdec:e2e_request_latency_seconds", "Arrival to last token", names,
                             buckets=_LATENCY_BUCKETS, registry=r).labels(**lbl)
        self.queue_time = Histogram("specdec:request_queue_time_seconds", "Arrival to start of decoding", names,
                                    buckets=_LATENCY_BUCKETS, registry=r).labels(**lbl)
        self._pool_enabled = Gauge("specdec:spec_decode_pool_enabled",
                                   "1 while a speculation pool speculates, 0 after it fell back to plain decoding",
                                   names + ["pool"], registry=r)
        self._arm_requests = Counter("specdec:rollout_requests", "Finished requests per rollout arm",
                                     names + ["arm"], registry=r)
        self._arm_tokens = Counter("specdec:rollout_generation_tokens", "Tokens generated per rollout arm",
                                   names + ["arm"], registry=r)
        self._arm_tpot = Histogram("specdec:rollout_time_per_output_token_seconds", "TPOT per rollout arm",
                                   names + ["arm"], buckets=_TPOT_BUCKETS, registry=r)
        self._arm_e2e = Histogram("specdec:rollout_e2e_request_latency_seconds", "E2E latency per rollout arm",
                                  names + ["arm"], buckets=_LATENCY_BUCKETS, registry=r)
        # the shape of each engine step: continuous batching puts several sequences (and their drafts) in a forward
        self.iteration_tokens = Histogram("specdec:iteration_tokens_total", "Rows (tokens) per engine forward",
                                          names, buckets=(1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512,
                                                          1024), registry=r).labels(**lbl)
        self.iteration_seqs = Histogram("specdec:iteration_num_seqs", "Sequences per engine forward", names,
                                        buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64), registry=r).labels(**lbl)
        # prefix caching, in prompt tokens (vLLM's prefix_cache_queries / prefix_cache_hits counters)
        self.prefix_queries = Counter("specdec:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      names, registry=r).labels(**lbl)
        self.prefix_hits = Counter("specdec:prefix_cache_hits", "Prompt tokens whose K/V came from the prefix cache",
                                   names, registry=r).labels(**lbl)
        self.prefix_tokens = Gauge("specdec:prefix_cache_tokens", "Tokens held by prefix cache entries", names,
                                   registry=r).labels(**lbl)
        self.prefix_bytes = Gauge("specdec:prefix_cache_bytes", "Bytes of K/V held by prefix cache entries", names,
                                  registry=r).labels(**lbl)
        self._prefix_seen = {"queries": 0, "hits": 0}
        # vLLM V1's names: the gaps between a request's iterations that gave it tokens, preemptions, KV in use
        self.itl = Histogram("specdec:inter_token_latency_seconds", "Time between a request's consecutive token "
                             "deliveries (one may carry several tokens)", names, buckets=_TPOT_BUCKETS,
                             registry=r).labels(**lbl)
        self.preemptions = Counter("specdec:num_preemptions", "Sequences preempted (caches freed, recomputed later)",
                                   names, registry=r).labels(**lbl)
        self.kv_usage = Gauge("specdec:kv_cache_usage_perc", "Share of the KV budget running sequences hold (1 = all)",
                              names, registry=r).labels(**lbl)
        # speculation per speculation pool and the method that ran (auto's choice, or plain after a fallback)
        per = names + ["pool", "method"]
        self._pool_requests = Counter("specdec:spec_decode_pool_requests", "Finished requests per pool and method",
                                      per, registry=r)
        self._pool_drafts = Counter("specdec:spec_decode_pool_num_drafts", "Verification steps with a draft, per "
                                    "pool and method", per, registry=r)
        self._pool_draft_tokens = Counter("specdec:spec_decode_pool_num_draft_tokens", "Draft tokens proposed, per "
                                          "pool and method", per, registry=r)
        self._pool_accepted = Counter("specdec:spec_decode_pool_num_accepted_tokens", "Draft tokens accepted, per "
                                      "pool and method", per, registry=r)
        self._lock = threading.Lock()
        self._window = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "draft_time": 0.0, "e2e_time": 0.0,
                        "tokens": 0.0, "since": time.monotonic()}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def set_prefix_cache(self, status: dict) -> None:
        """The engine's prefix cache counters (cumulative) and size."""
        if not status.get("enabled"):
            return
        for name, counter in (("queries", self.prefix_queries), ("hits", self.prefix_hits)):
            if status[name] > self._prefix_seen[name]:
                counter.inc(status[name] - self._prefix_seen[name])
                self._prefix_seen[name] = status[name]
        self.prefix_tokens.set(status["tokens"])
        self.prefix_bytes.set(status["bytes"])

    def set_queue(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def observe_step(self, num_seqs: int, num_rows: int, num_preempted: int = 0, kv_usage: float | None = None
                     ) -> None:
        self.iteration_seqs.observe(num_seqs)
        self.iteration_tokens.observe(num_rows)
        if num_preempted:
            self.preemptions.inc(num_preempted)
        if kv_usage is not None:
            self.kv_usage.set(kv_usage)

    def observe_token_gap(self, s: float) -> None:
        self.itl.observe(s)

    def observe_queue_time(self, s: float) -> None:
        self.queue_time.observe(s)

    def observe_first_token(self, s: float) -> None:
        self.ttft.observe(s)

    def _observe_spec(self, stats, pool: str) -> None:
        per = {**self._lbl, "pool": pool, "method": stats.method}
        self._pool_drafts.labels(**per).inc(stats.draft_steps)
        self._pool_draft_tokens.labels(**per).inc(stats.draft_tokens)
        self._pool_accepted.labels(**per).inc(stats.accepted_tokens)
        self.drafts.inc(stats.draft_steps)
        self.draft_tokens.inc(stats.draft_tokens)
        self.accepted_tokens.inc(stats.accepted_tokens)
        for i, n in enumerate(stats.accepted_counts_per_position[:MAX_POSITIONS]):   # every drafted position
            self._per_pos.labels(**self._lbl, position=str(i)).inc(n)
        self.draft_time.inc(stats.draft_time_s)
        self.verify_time.inc(stats.verify_time_s)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.completion_tokens)
        with self._lock:
            w = self._window
            w["drafts"] += stats.draft_steps
            w["draft_tokens"] += stats.draft_tokens
            w["accepted"] += stats.accepted_tokens
            w["draft_time"] += stats.draft_time_s
            w["e2e_time"] += stats.e2e_s
            w["tokens"] += stats.completion_tokens

    def set_pool_enabled(self, pool: str, enabled: bool) -> None:
        self._pool_enabled.labels(**self._lbl, pool=pool).set(1 if enabled else 0)

    def observe_finished(self, stats, arrival: float, arm: str = "spec", pool: str = "default") -> None:
        self._observe_spec(stats, pool)
        self._pool_requests.labels(**self._lbl, pool=pool, method=stats.method).inc()
        self._success.labels(**self._lbl, finished_reason=stats.finish_reason or "stop").inc()
        e2e = time.perf_counter() - arrival
        if stats.completion_tokens > 1:
            self.tpot.observe(stats.tpot_s)
            self._arm_tpot.labels(**self._lbl, arm=arm).observe(stats.tpot_s)
        self.e2e.observe(e2e)
        self._arm_e2e.labels(**self._lbl, arm=arm).observe(e2e)
        self._arm_requests.labels(**self._lbl, arm=arm).inc()
        self._arm_tokens.labels(**self._lbl, arm=arm).inc(stats.completion_tokens)

    def observe_abort(self, stats, pool: str = "default") -> None:
        self.aborted.inc()
        if stats is not None:
            self._observe_spec(stats, pool)

    def observe_failure(self) -> None:
        self.failed.inc()

    def interval_log_line(self) -> str | None:
        """The periodic log line (vLLM's SpecDecoding metrics line), over the requests since the last one."""
        with self._lock:
            w = self._window
            elapsed = time.monotonic() - w["since"]
            if not w["tokens"]:
                w["since"] = time.monotonic()
                return None
            acc = w["accepted"] / w["draft_tokens"] if w["draft_tokens"] else None
            mal = 1 + w["accepted"] / w["drafts"] if w["drafts"] else None
            overhead = w["draft_time"] / w["e2e_time"] if w["e2e_time"] else 0.0
            line = (f"SpecDecoding metrics: mean acceptance length {mal:.2f}, " if mal else
                    "SpecDecoding metrics: mean acceptance length -, ")
            line += (f"acceptance rate {acc:.3f}, " if acc is not None else "acceptance rate -, ")
            line += (f"draft overhead {overhead:.1%}, throughput {w['tokens'] / elapsed:.2f} tok/s, "
                     f"drafts {w['drafts']:.0f}, draft tokens {w['draft_tokens']:.0f}, accepted {w['accepted']:.0f}")
            self._window = {k: 0.0 for k in w} | {"since": time.monotonic()}
            return line


def merge_labelled(texts: dict[str, bytes | str], label: str = "replica") -> bytes:
    """Several processes' Prometheus text (e.g. each engine replica's `render()`) as one exposition: every sample
    gains `label="<key>"`, each family is written once (a Prometheus user sees the names of one process)."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    for key, text in texts.items():
        if isinstance(text, bytes):
            text = text.decode()
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                merged.add_sample(s.name, {label: key, **s.labels}, s.value, s.timestamp, s.exemplar)

    return _exposition(list(families.values()))


def _exposition(families: list) -> bytes:
    """Prometheus text for metric families built by hand (prometheus_client's Metric objects)."""

    class _Families:
        def collect(self):
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families())
    return generate_latest(registry)


VLLM_ENGINE_LABEL = {"engine": "0"}      # the label vLLM's families carry beside model_name (one engine here)


def vllm_alias(text: bytes | str) -> bytes:
    """Every `specdec:` family of an exposition again under `vllm:` with vLLM's `engine` label added
    (--export-vllm-metrics: dashboards and alerts written for vLLM read specdec unchanged). Families vLLM lacks are
    renamed too (extra names cost a vLLM query nothing); process_* families, unprefixed, are left as they are."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    if isinstance(text, bytes):
        text = text.decode()
    families = []
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("specdec:"):
            continue
        name = "vllm:" + fam.name.removeprefix("specdec:")
        alias = Metric(name, fam.documentation, fam.type, fam.unit)
        for s in fam.samples:
            alias.add_sample("vllm:" + s.name.removeprefix("specdec:"), {**s.labels, **VLLM_ENGINE_LABEL}, s.value,
                             s.timestamp, s.exemplar)
        families.append(alias)
    return _exposition(families)
