"""`specdec bench serve --duration S`: sustained load on one endpoint, then the greedy answers checked alone.

`--concurrency C` clients (16 by default here) send requests back to back for S seconds, each drawn from a mix
(seeded): short chats streamed and not, long-context questions, structured outputs (a JSON schema), sampled
requests, and streams the client abandons after a few chunks; each request names one of the methods the server
runs (`speculative.method`, or none: the server's default). A 429 is waited out for its Retry-After before the
client goes on. Every 15 s the server's resident memory (`process_resident_memory_bytes` in /metrics), its prefix
cache and its suffix pools are sampled. Then up to `--replay` of the greedy requests that completed are sent again,
one at a time, and their texts compared with what the same requests got under load.

Reported: requests by kind and outcome (ok, aborted by the client, 429, clean errors, 5xx), TTFT / ITL / E2E
percentiles, the memory timeline, and the replayed answers identical out of checked.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from dataclasses import dataclass, field

from ..errors import SpecDecError
from .serve import error_message, record_chunk
from .summary import percentile

KINDS = {"chat-stream": 0.35, "chat": 0.15, "long-stream": 0.1, "structured": 0.12, "sampled": 0.1, "abort": 0.18}
GREEDY_KINDS = ("chat-stream", "chat", "long-stream", "structured")
ABORT_AFTER_CHUNKS = 3
SAMPLE_EVERY_S = 15.0


@dataclass
class LoadConfig:
    endpoint: str
    duration_s: float
    clients: int = 16
    model: str | None = None
    api_key: str | None = None
    max_tokens: int = 64
    long_chars: int = 6000               # the long-context questions' document (~1.4k tokens)
    seed: int = 0
    replay: int = 24                     # greedy requests sent again alone afterwards
    timeout_s: float = 600.0
    methods: list[str] = field(default_factory=list)   # empty: those the server's status lists, and its default

    def __post_init__(self):
        if self.duration_s <= 0 or self.clients < 1:
            raise SpecDecError("--duration must be > 0 and --concurrency >= 1")


def _requests(cfg: LoadConfig) -> dict[str, list[dict]]:
    from .datasets import load_prompts
    from .stall import long_text

    doc = long_text(cfg.long_chars)
    questions = ["Which functions does this document describe first?", "Summarize the document in one sentence.",
                 "What error types does the document mention?", "Quote the first example in the document."]
    return {"chat": [p["messages"] for p in load_prompts("builtin", cfg.seed)],
            "long": [[{"role": "user", "content": f"{doc}\n\n{q}"}] for q in questions],
            "structured": [{"messages": p["messages"], "response_format": p["response_format"]}
                           for p in load_prompts("structured", cfg.seed)]}


def _body(kind: str, rng: random.Random, pool: dict, model: str, cfg: LoadConfig, methods: list[str]) -> dict:
    body = {"model": model, "max_tokens": cfg.max_tokens, "temperature": 0.0,
            "stream": kind not in ("chat", "structured")}
    if kind == "long-stream":
        body["messages"] = rng.choice(pool["long"])
        body["max_tokens"] = min(32, cfg.max_tokens)
    elif kind == "structured":
        body.update(rng.choice(pool["structured"]))
    else:
        body["messages"] = rng.choice(pool["chat"])
    if kind == "sampled":
        body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 31))
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    method = rng.choice(methods)
    if method:
        body["speculative"] = {"method": method}
    return body


async def _send(client, url: str, body: dict, headers: dict, abort: bool) -> dict:
    rec = {"status": None, "ttft_s": None, "itl_s": [], "e2e_s": None, "text": "", "error": None,
           "retry_after": None, "aborted": False, "finish_reason": None}
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            rec["status"] = r.status_code
            if r.status_code != 200:
                rec["retry_after"] = r.headers.get("retry-after")
                rec["error"] = error_message((await r.aread()).decode(errors="replace"))
            elif not body["stream"]:
                obj = json.loads(await r.aread())
                rec["ttft_s"] = time.perf_counter() - t0
                rec["text"] = obj["choices"][0]["message"].get("content") or ""
                rec["finish_reason"] = obj["choices"][0].get("finish_reason")
            else:
                last, chunks = None, 0
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    obj = json.loads(line[5:])
                    if "error" in obj and not obj.get("choices"):
                        rec["error"] = f"stream error: {obj['error'].get('message')}"
                        break
                    for ch in obj.get("choices") or []:
                        text = (ch.get("delta") or {}).get("content") or ""
                        if text:
                            last = record_chunk(rec, t0, last)
                            rec["text"] += text
                            chunks += 1
                        rec["finish_reason"] = ch.get("finish_reason") or rec["finish_reason"]
                    if abort and chunks >= ABORT_AFTER_CHUNKS:
                        rec["aborted"] = True
                        break                       # leaving the block closes the connection mid-stream
    except Exception as exc:  # noqa: BLE001 - a failed request is a data point
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["e2e_s"] = time.perf_counter() - t0
    return rec


def _metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


async def _sample(client, url: str, headers: dict, t0: float) -> dict:
    metrics = (await client.get(url + "/metrics", headers=headers)).text
    try:
        status = (await client.get(url + "/v1/speculative/status", headers=headers)).json()
    except ValueError:
        status = {}
    # what the methods keep learning (suffix decoding's pools report their tokens)
    learned = sum((m.get("status") or {}).get("tokens", 0) for m in status.get("methods", []))
    return {"t_s": round(time.perf_counter() - t0, 1),
            "rss_mb": (_metric(metrics, "process_resident_memory_bytes") or 0) / 2 ** 20,
            "prefix_cache_tokens": _metric(metrics, "specdec:prefix_cache_tokens"),
            "prefix_cache_mb": (_metric(metrics, "specdec:prefix_cache_bytes") or 0) / 2 ** 20,
            "suffix_tokens": learned, "running": _metric(metrics, "specdec:num_requests_running"),
            "waiting": _metric(metrics, "specdec:num_requests_waiting")}


async def _methods_a_prompt_can_name(client, url: str, headers: dict, model: str, status: dict) -> list[str]:
    """The methods the server lists that answer a plain prompt (a server may refuse one that drafts from something
    else a request must bring; a refused method is left out of the mix)."""
    out = []
    for m in [m["method"] for m in status.get("methods", [])]:
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                "speculative": {"method": m}}
        if (await client.post(url + "/v1/chat/completions", json=body, headers=headers)).status_code == 200:
            out.append(m)
    return out


async def _run(cfg: LoadConfig, progress: bool) -> dict:
    import httpx

    url = cfg.endpoint.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.clients + 8)
    async with httpx.AsyncClient(timeout=cfg.timeout_s, limits=limits) as client:
        model = cfg.model or (await client.get(url + "/v1/models", headers=headers)).json()["data"][0]["id"]
        status = (await client.get(url + "/v1/speculative/status", headers=headers)).json()
        methods = cfg.methods or ["", *await _methods_a_prompt_can_name(client, url, headers, model, status)]
        pool = _requests(cfg)
        kinds, weights = list(KINDS), list(KINDS.values())
        records: list[dict] = []
        samples = [await _sample(client, url, headers, time.perf_counter())]
        t0 = time.perf_counter()
        end = t0 + cfg.duration_s

        async def worker(i: int):
            rng = random.Random(cfg.seed * 1000 + i)
            while time.perf_counter() < end:
                kind = rng.choices(kinds, weights)[0]
                body = _body(kind, rng, pool, model, cfg, methods)
                rec = await _send(client, url, body, headers, abort=kind == "abort")
                records.append({"client": i, "kind": kind, "method": body.get("speculative", {}).get("method", ""),
                                "sent_s": round(time.perf_counter() - t0 - rec["e2e_s"], 3), "body": body, **rec})
                if rec["status"] == 429:
                    await asyncio.sleep(float(rec["retry_after"] or 1))

        async def sampler():
            while time.perf_counter() < end:
                await asyncio.sleep(min(SAMPLE_EVERY_S, max(0.0, end - time.perf_counter())))
                samples.append(await _sample(client, url, headers, t0))
                if progress:
                    s = samples[-1]
                    print(f"bench load: {s['t_s']:.0f} s, {len(records)} requests, RSS {s['rss_mb']:.0f} MiB, "
                          f"running {s['running']}, waiting {s['waiting']}", flush=True)

        await asyncio.gather(sampler(), *[worker(i) for i in range(cfg.clients)])
        elapsed = time.perf_counter() - t0
        samples.append(await _sample(client, url, headers, t0))
        # the greedy answers again, alone: one of each distinct request that completed under load
        seen, replays = set(), []
        for r in records:
            key = json.dumps(r["body"], sort_keys=True)
            if (r["kind"] in GREEDY_KINDS and r["status"] == 200 and not r["error"] and r["finish_reason"]
                    and key not in seen and len(replays) < cfg.replay):
                seen.add(key)
                again = await _send(client, url, r["body"], headers, abort=False)
                replays.append({"kind": r["kind"], "method": r["method"], "identical": again["text"] == r["text"],
                                "under_load": r["text"][:200], "alone": again["text"][:200]})
    return {"records": records, "samples": samples, "replays": replays, "elapsed_s": elapsed, "model": model,
            "methods": methods}


def _pcts(xs: list[float]) -> dict:
    return {f"p{q}": percentile(xs, q) for q in (50, 95, 99)} if xs else {}


def summarize(raw: dict, cfg: LoadConfig) -> dict:
    recs = raw["records"]
    outcome = lambda r: ("5xx" if (r["status"] or 0) >= 500 else "429" if r["status"] == 429   # noqa: E731
                         else "error" if r["error"] or r["status"] != 200 else "aborted" if r["aborted"] else "ok")
    by_kind = {}
    for r in recs:
        row = by_kind.setdefault(r["kind"], {"ok": 0, "aborted": 0, "429": 0, "error": 0, "5xx": 0})
        row[outcome(r)] += 1
    done = [r for r in recs if outcome(r) in ("ok", "aborted")]
    s0, s1 = raw["samples"][0], raw["samples"][-1]
    return {
        "endpoint": cfg.endpoint, "duration_s": raw["elapsed_s"], "clients": cfg.clients, "methods": raw["methods"],
        "requests": len(recs), "by_kind": by_kind,
        "server_errors_5xx": sum(outcome(r) == "5xx" for r in recs),
        "rate_limited_429": sum(r["status"] == 429 for r in recs),
        "rate_limited_with_retry_after": sum(r["status"] == 429 and r["retry_after"] is not None for r in recs),
        "clean_errors": sorted({f"{r['status']}: {r['error']}"[:160] for r in recs if outcome(r) == "error"}),
        "incomplete": sum(outcome(r) == "ok" and not r["finish_reason"] for r in recs),
        "ttft_s": _pcts([r["ttft_s"] for r in done if r["ttft_s"] is not None]),
        "itl_s": _pcts([x for r in done for x in r["itl_s"]]),
        "e2e_s": _pcts([r["e2e_s"] for r in done if not r["aborted"]]),
        "output_chars_per_s": sum(len(r["text"]) for r in done) / raw["elapsed_s"],
        "rss_mb": {"start": s0["rss_mb"], "end": s1["rss_mb"], "max": max(s["rss_mb"] for s in raw["samples"])},
        "prefix_cache_mb_end": s1["prefix_cache_mb"], "suffix_tokens_end": s1["suffix_tokens"],
        "replayed": len(raw["replays"]), "replayed_identical": sum(r["identical"] for r in raw["replays"]),
    }


def render_load_report(summary: dict, samples: list[dict]) -> str:
    s = summary
    f = lambda d: " / ".join(f"{d[k]:.3f}" for k in ("p50", "p95", "p99")) if d else "-"   # noqa: E731
    lines = [f"# Sustained load: {s['clients']} clients for {s['duration_s']:.0f} s", "",
             f"{s['requests']} requests against {s['endpoint']}; methods per request: "
             f"{', '.join(m or '(server default)' for m in s['methods'])}.", "",
             "| kind | ok | aborted by the client | 429 | clean error | 5xx |", "|---|---|---|---|---|---|"]
    for kind, row in sorted(s["by_kind"].items()):
        lines.append(f"| {kind} | {row['ok']} | {row['aborted']} | {row['429']} | {row['error']} | {row['5xx']} |")
    lines += ["", f"- 5xx: **{s['server_errors_5xx']}**; 429: {s['rate_limited_429']} "
              f"({s['rate_limited_with_retry_after']} with Retry-After); ok without a finish reason: "
              f"{s['incomplete']}",
              f"- clean errors: {'; '.join(s['clean_errors']) or 'none'}",
              f"- TTFT P50 / P95 / P99 (s): {f(s['ttft_s'])}; ITL: {f(s['itl_s'])}; E2E: {f(s['e2e_s'])}",
              f"- server RSS: {s['rss_mb']['start']:.0f} MiB at start, {s['rss_mb']['end']:.0f} at the end, "
              f"{s['rss_mb']['max']:.0f} at most; prefix cache {s['prefix_cache_mb_end']:.0f} MiB and suffix pools "
              f"{s['suffix_tokens_end']} tokens at the end",
              f"- greedy answers replayed alone: **{s['replayed_identical']} / {s['replayed']} identical** to the "
              "same requests under load", "", "| t (s) | RSS MiB | prefix cache MiB | suffix tokens | running | "
              "waiting |", "|---|---|---|---|---|---|"]
    lines += [f"| {x['t_s']:.0f} | {x['rss_mb']:.0f} | {x['prefix_cache_mb']:.0f} | {x['suffix_tokens']} | "
              f"{x['running']} | {x['waiting']} |" for x in samples]
    return "\n".join(lines) + "\n"


def run_load_bench(cfg: LoadConfig, out: str, progress: bool = True) -> dict:
    from pathlib import Path

    from ..utils import write_json_atomic, write_text_atomic
    from .offline import machine_info

    raw = asyncio.run(_run(cfg, progress))
    summary = summarize(raw, cfg)
    result = {"config": {k: v for k, v in vars(cfg).items() if k != "api_key"}, "machine": machine_info(os.cpu_count()),
              "summary": summary, "samples": raw["samples"], "replays": raw["replays"],
              "requests": [{k: v for k, v in r.items() if k not in ("body", "text")} for r in raw["records"]]}
    Path(out).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(out) / "results.json", result)
    write_text_atomic(Path(out) / "report.md", render_load_report(summary, raw["samples"]))
    return result
