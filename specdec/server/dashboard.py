"""The live page: `GET /dashboard` (one self-contained HTML file shipped in the package: no CDN, works offline) plots
the last minutes of tok/s, TTFT, acceptance, accepted length and the method each pool ran, from
`GET /v1/dashboard/data` (behind the API key, like the rest of /v1).

The history is sampled by the HTTP layer, not the engine: once a second a task reads the server's own Prometheus
exposition (`engine.render_metrics()`: one engine, or every Ray replica's merged) and keeps the counters it needs,
15 minutes of them. The data endpoint only reads that buffer, so the page never waits on, or slows, a step.
"""
from __future__ import annotations

import asyncio
import collections
import time
from importlib import resources

from prometheus_client.parser import text_string_to_metric_families

SAMPLE_EVERY_S = 1.0
KEEP = 900                      # samples (15 minutes)
COUNTERS = {"specdec:generation_tokens": "tokens", "specdec:spec_decode_num_draft_tokens": "draft_tokens",
            "specdec:spec_decode_num_accepted_tokens": "accepted", "specdec:spec_decode_num_drafts": "drafts"}
POOL_REQUESTS = "specdec:spec_decode_pool_requests"
TTFT = "specdec:time_to_first_token_seconds"


# the samples read_sample keeps: the exposition's other lines (histogram buckets, per-position counters, process
# metrics: ~24 KB in all) are dropped before the parser sees them
SAMPLES = frozenset({f"{name}_total" for name in COUNTERS} | {TTFT + "_sum", TTFT + "_count", POOL_REQUESTS + "_total"})


def wanted_lines(text: str) -> str:
    """The lines of the samples in SAMPLES (0.12 ms). Parsing the whole exposition once a second took ~2.4 ms of
    Python on a thread beside the engine's; what either costs a step is under a 2-core machine's noise
    (docs/benchmarks/server-overhead)."""
    keep = [line for line in text.splitlines()
            if line and line[0] != "#" and line.split("{", 1)[0].split(" ", 1)[0] in SAMPLES]
    return "\n".join(keep) + "\n"


def read_sample(text: str) -> dict:
    """The counters the page plots, summed over replicas and labels; per (pool, method) finished requests."""
    out = {v: 0.0 for v in COUNTERS.values()} | {"ttft_sum": 0.0, "ttft_count": 0.0, "methods": {}}
    for fam in text_string_to_metric_families(wanted_lines(text)):
        for s in fam.samples:                       # by sample name: a family's name depends on its HELP line
            base = s.name.removesuffix("_total")
            if base in COUNTERS and s.name.endswith("_total"):
                out[COUNTERS[base]] += s.value
            elif s.name in (TTFT + "_sum", TTFT + "_count"):
                out["ttft_" + s.name.rsplit("_", 1)[1]] += s.value
            elif s.name == POOL_REQUESTS + "_total":
                key = f"{s.labels.get('pool', '')}/{s.labels.get('method', '')}"
                out["methods"][key] = out["methods"].get(key, 0.0) + s.value
    return out


def totals(sample: dict) -> dict:
    """Acceptance rate and mean accepted length since the server started (None before any draft)."""
    return {"draft_tokens": int(sample["draft_tokens"]), "accepted_tokens": int(sample["accepted"]),
            "acceptance_rate": sample["accepted"] / sample["draft_tokens"] if sample["draft_tokens"] else None,
            "mean_accepted_length": 1 + sample["accepted"] / sample["drafts"] if sample["drafts"] else None}


class LiveSeries:
    def __init__(self, render, every_s: float = SAMPLE_EVERY_S, keep: int = KEEP):
        self.render = render                    # () -> the Prometheus exposition (bytes or str)
        self.every_s = every_s
        self.samples: collections.deque[tuple[float, dict]] = collections.deque(maxlen=keep)
        self._task: asyncio.Task | None = None

    def sample(self) -> dict:
        text = self.render()
        s = read_sample(text.decode() if isinstance(text, bytes) else text)
        self.samples.append((time.time(), s))
        return s

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sample)
            except Exception:  # noqa: BLE001 - a failed read is a gap in the plot, never a server error
                pass
            await asyncio.sleep(self.every_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def window(self, seconds: int, step: int) -> dict:
        """Rates over consecutive `step`-second intervals of the last `seconds`: tok/s, mean TTFT, acceptance,
        accepted length and finished requests/s per pool/method; and the totals since start."""
        now = time.time()
        pts = [(t, s) for t, s in self.samples if t >= now - seconds - step]
        picked: list[tuple[float, dict]] = []
        for t, s in pts:                             # one sample per step
            if not picked or t - picked[-1][0] >= step - 0.5 * self.every_s:
                picked.append((t, s))
        out = {"t": [], "tokens_per_s": [], "ttft_s": [], "acceptance": [], "accepted_length": [], "methods": {}}
        for (t0, a), (t1, b) in zip(picked, picked[1:]):
            dt = max(t1 - t0, 1e-9)
            d = {k: b[k] - a[k] for k in ("tokens", "draft_tokens", "accepted", "drafts", "ttft_sum", "ttft_count")}
            out["t"].append(round(t1, 3))
            out["tokens_per_s"].append(d["tokens"] / dt)
            out["ttft_s"].append(d["ttft_sum"] / d["ttft_count"] if d["ttft_count"] else None)
            out["acceptance"].append(d["accepted"] / d["draft_tokens"] if d["draft_tokens"] else None)
            out["accepted_length"].append(1 + d["accepted"] / d["drafts"] if d["drafts"] else None)
            for key in set(a["methods"]) | set(b["methods"]):
                series = out["methods"].setdefault(key, [None] * (len(out["t"]) - 1))
                series.append((b["methods"].get(key, 0.0) - a["methods"].get(key, 0.0)) / dt)
            for series in out["methods"].values():
                series.extend([None] * (len(out["t"]) - len(series)))
        out["totals"] = totals(self.samples[-1][1]) if self.samples else None
        return out


def page() -> str:
    return resources.files("specdec.server").joinpath("static/dashboard.html").read_text(encoding="utf-8")
