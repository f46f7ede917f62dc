"""`specdec bench serve`: a serving benchmark against any OpenAI-compatible endpoint (ours, llama.cpp's, vLLM).

For each concurrency level, every prompt of the dataset is sent to every endpoint as a streaming chat request
with at most `concurrency` in flight. Interleaved (the default), the prompts go in rounds of `concurrency`: a
round is sent to each endpoint in turn (the order rotating from round to round) before the next round starts, so
that a drifting machine (another tenant, thermal state) cannot favour one server; `--no-interleave` runs each
endpoint through the whole set in turn. Per request: TTFT (first content chunk), TPOT = (E2E - TTFT)/(tokens - 1),
ITL (gaps between chunks; with speculation one chunk can carry several tokens, so mean accepted length is reported
beside it), E2E, decode tok/s = (tokens - 1) / (E2E - TTFT), output tokens (from `usage`), and the server's
speculative stats when it reports them (specdec's `speculative` extension). Percentiles P50/P90/P95/P99, request and
output-token throughput, errors; per category, the median decode tok/s and its ratio to the first endpoint's; with two
or more endpoints at temperature 0, the share of completions identical to the first's.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import SpecDecError
from .datasets import load_prompts
from .idle import wait_until_idle
from .serve_report import PCTS, render_serve_report, write_serve_plots
from .structured_prompts import schema_valid
from .summary import median, percentile


@dataclass
class ServeBenchConfig:
    endpoints: list[str]
    dataset: str = "builtin"
    model: str | None = None
    concurrency: list[int] = field(default_factory=lambda: [1])
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    out: str = "out/bench-serve"
    labels: list[str] = field(default_factory=list)
    extra_body: list[dict] = field(default_factory=list)
    api_key: str | None = None
    timeout_s: float = 600.0
    interleave: bool = True
    turns: int = 0                       # > 0: multi-turn conversations (bench/conversations.py), TTFT per turn
    think_time_s: float = 0.0            # conversations: pause after each answer (a user reading), before the next
    prediction: list[str] = field(default_factory=list)   # endpoint labels sent each prompt's `prediction`
    wait_idle: bool = True               # send each round only once the machine is idle (bench/idle.py)
    idle_max_busy: float = 0.1           # ... at most this share of the CPUs busy over a quarter second
    rounds: int = 1                      # the prompts cut into this many rounds: medians per round, their spread

    def __post_init__(self):
        if not self.endpoints:
            raise SpecDecError("give at least one --endpoint URL")
        for e in self.endpoints:
            if not e.startswith(("http://", "https://")):
                raise SpecDecError(f"--endpoint must be an http(s) URL, got '{e}'")
        self.endpoints = [e.rstrip("/").removesuffix("/v1") for e in self.endpoints]
        if any(c < 1 for c in self.concurrency) or not self.concurrency:
            raise SpecDecError(f"--concurrency values must be >= 1, got {self.concurrency}")
        if self.rounds < 1:
            raise SpecDecError(f"--rounds must be >= 1, got {self.rounds}")
        if self.think_time_s < 0:
            raise SpecDecError("--think-time must be >= 0")
        if self.max_tokens < 1 or self.temperature < 0:
            raise SpecDecError("--max-tokens must be >= 1 and --temperature >= 0")
        if self.labels and len(self.labels) != len(self.endpoints):
            raise SpecDecError("give one --label per --endpoint")
        self.labels = self.labels or [f"{i}:{e}" for i, e in enumerate(self.endpoints)]
        if len(set(self.labels)) != len(self.labels):
            raise SpecDecError("endpoint labels must be distinct (use --label)")
        if len(self.extra_body) not in (0, 1, len(self.endpoints)):
            raise SpecDecError("give --extra-body once (all endpoints) or once per --endpoint")
        if len(self.extra_body) == 1:
            self.extra_body = self.extra_body * len(self.endpoints)
        self.extra_body = self.extra_body or [{} for _ in self.endpoints]
        unknown = [p for p in self.prediction if p not in self.labels]
        if unknown:
            raise SpecDecError(f"--prediction '{unknown[0]}' is not an endpoint label ({', '.join(self.labels)})")


def record_chunk(rec: dict, start: float, last: float | None) -> float:
    """A content chunk arrived now: the request's TTFT if it is the first, else one more inter-token gap. Returns
    now (the next chunk's `last`)."""
    now = time.perf_counter()
    if rec["ttft_s"] is None:
        rec["ttft_s"] = now - start
    else:
        rec["itl_s"].append(now - last)
    return now


def error_message(raw: str) -> str:
    """An error response's message: OpenAI's error JSON's, else the body's first 200 characters."""
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw[:200]


async def _one(client, url: str, body: dict, headers: dict) -> dict:
    rec = {"ok": False, "error": None, "ttft_s": None, "e2e_s": None, "itl_s": [], "output_tokens": None,
           "decode_tok_s": None, "prompt_tokens": None, "cached_tokens": None,
           "text": "", "finish_reason": None, "speculative": None}
    start = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {error_message((await r.aread()).decode(errors='replace'))}"
                return rec
            parts = []
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj and not obj.get("choices"):
                    rec["error"] = f"stream error: {obj['error'].get('message')}"
                    return rec
                if obj.get("usage"):
                    rec["output_tokens"] = obj["usage"].get("completion_tokens")
                    rec["prompt_tokens"] = obj["usage"].get("prompt_tokens")
                    rec["cached_tokens"] = (obj["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
                if obj.get("speculative"):
                    rec["speculative"] = obj["speculative"]
                for ch in obj.get("choices") or []:
                    text = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                    if text:
                        last = record_chunk(rec, start, last)
                        parts.append(text)
                    if ch.get("finish_reason"):
                        rec["finish_reason"] = ch["finish_reason"]
        rec["e2e_s"] = time.perf_counter() - start
        rec["text"] = "".join(parts)
        if rec["output_tokens"] is None:          # a server without usage in streams: count chunks
            rec["output_tokens"] = len(rec["itl_s"]) + (1 if rec["ttft_s"] is not None else 0)
        if rec["ttft_s"] is None:
            rec["ttft_s"] = rec["e2e_s"]
        if (rec["output_tokens"] or 0) > 1 and rec["e2e_s"] > rec["ttft_s"]:
            rec["decode_tok_s"] = (rec["output_tokens"] - 1) / (rec["e2e_s"] - rec["ttft_s"])
        rec["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a failed request is a data point
        rec["error"] = f"{type(exc).__name__}: {exc}"
    return rec


async def _level(cfg: ServeBenchConfig, idx: int, model: str, prompts: list[dict], concurrency: int,
                 indices: list[int] | None = None) -> tuple[list, float]:
    """Send `prompts` (their dataset indices: `indices`) to endpoint `idx`, at most `concurrency` in flight."""
    import httpx

    url = cfg.endpoints[idx]
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    sem = asyncio.Semaphore(concurrency)

    async def run(i, p):
        body = {"model": model, "messages": p["messages"], "max_tokens": cfg.max_tokens,
                "temperature": cfg.temperature, "seed": cfg.seed + i, "stream": True,
                "stream_options": {"include_usage": True},
                **({"response_format": p["response_format"]} if p.get("response_format") else {}),
                **({"prediction": {"type": "content", "content": p["prediction"]}}
                   if p.get("prediction") is not None and cfg.labels[idx] in cfg.prediction else {}),
                **cfg.extra_body[idx]}
        async with sem:
            rec = await _one(client, url, body, headers)
        if rec["ok"] and body.get("response_format"):
            rec["schema_valid"] = schema_valid(rec["text"], body["response_format"])
        return {"endpoint": cfg.labels[idx], "concurrency": concurrency, "prompt_index": i,
                "category": p["category"], **rec}

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=cfg.timeout_s, limits=limits) as client:
        t0 = time.perf_counter()
        recs = await asyncio.gather(*[run(i, p) for i, p in zip(indices or range(len(prompts)), prompts)])
        return list(recs), time.perf_counter() - t0


def _served_model(url: str, api_key: str | None) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url + "/v1/models", headers=headers, timeout=30)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except Exception as exc:  # noqa: BLE001
        raise SpecDecError(f"cannot list models at {url}/v1/models ({type(exc).__name__}: {exc}); "
                           "pass --model") from None


def summarize_level(recs: list[dict], duration_s: float) -> dict:
    good = [r for r in recs if r["ok"]]
    tpot = [(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in good if (r["output_tokens"] or 0) > 1]
    itl = [x for r in good for x in r["itl_s"]]
    row = {"requests": len(recs), "completed": len(good), "errors": len(recs) - len(good),
           "duration_s": duration_s,
           "request_throughput": len(good) / duration_s if duration_s else None,
           "output_throughput": sum(r["output_tokens"] or 0 for r in good) / duration_s if duration_s else None,
           "output_tokens": sum(r["output_tokens"] or 0 for r in good)}
    # prompt tokens the server reported, and how many of them its prefix cache served (usage.prompt_tokens_details)
    row["prompt_tokens"] = sum(r.get("prompt_tokens") or 0 for r in good)
    cached = [r["cached_tokens"] for r in good if r.get("cached_tokens") is not None]
    row["cached_tokens"] = sum(cached) if cached else None
    for name, xs in (("ttft", [r["ttft_s"] for r in good]), ("tpot", tpot), ("itl", itl),
                     ("e2e", [r["e2e_s"] for r in good])):
        row[f"{name}_mean_s"] = sum(xs) / len(xs) if xs else None
        for q in PCTS:
            row[f"{name}_p{q}_s"] = percentile(xs, q)
    # decode speed per request (the figure a single user feels), median over all requests and per category
    row["decode_tok_s_p50"] = median([r["decode_tok_s"] for r in good if r.get("decode_tok_s")])
    row["decode_tok_s_by_category"] = {
        cat: median([r["decode_tok_s"] for r in good if r["category"] == cat and r.get("decode_tok_s")])
        for cat in dict.fromkeys(r["category"] for r in recs)}
    spec = [r["speculative"] for r in good if r.get("speculative")]
    drafted = sum(s.get("draft_tokens") or 0 for s in spec)
    accepted = sum(s.get("accepted_tokens") or 0 for s in spec)
    steps = sum(s.get("draft_steps") or 0 for s in spec)
    row["acceptance_rate"] = accepted / drafted if drafted else None
    row["mean_accepted_length"] = 1 + accepted / steps if steps else None
    row["tokens_per_chunk"] = (sum(r["output_tokens"] or 0 for r in good) /
                               sum(len(r["itl_s"]) + 1 for r in good)) if good else None
    checked = [r["schema_valid"] for r in good if r.get("schema_valid") is not None]
    row["schema_valid"] = f"{sum(checked)}/{len(checked)}" if checked else None
    out_tokens = sum(r["output_tokens"] or 0 for r in good)
    forced = sum(s.get("forced_tokens") or 0 for s in spec)
    row["forced_share"] = forced / out_tokens if checked and out_tokens else None
    return row


def ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine and theirs else None


def add_ratios(summary: list[dict]) -> None:
    """Each row's median decode tok/s over the first endpoint's at the same concurrency, overall and per category
    (a ratio of medians, both taken over the same prompts)."""
    first = {}
    for row in summary:
        first.setdefault(row["concurrency"], row)
    for row in summary:
        ref = first[row["concurrency"]]
        row["decode_ratio"] = ratio(row["decode_tok_s_p50"], ref["decode_tok_s_p50"])
        row["decode_ratio_by_category"] = {c: ratio(v, ref["decode_tok_s_by_category"].get(c))
                                           for c, v in row["decode_tok_s_by_category"].items()}
        row["throughput_ratio"] = ratio(row["output_throughput"], ref["output_throughput"])


def round_of(prompt_index: int, num_prompts: int, rounds: int) -> int:
    """Which of `rounds` consecutive slices of the prompts holds this one. Rounds are disjoint slices, not repeats:
    a prompt sent twice would find the second time what a server learned from the first (its suffix pools, its
    prefix cache), so a repeat would not measure the same thing again."""
    return min(prompt_index * rounds // max(num_prompts, 1), rounds - 1)


def add_rounds(summary: list[dict], requests: list[dict], rounds: int) -> None:
    """Per row: its median decode tok/s in each round, and the ratio to the first endpoint's in the same round
    (overall and by category); then the median over rounds and the spread (min, max)."""
    first = {}
    for row in summary:
        first.setdefault(row["concurrency"], row["endpoint"])

    def medians(endpoint, conc, rnd):
        good = [r for r in requests if r["endpoint"] == endpoint and r["concurrency"] == conc
                and r.get("round") == rnd and r["ok"] and r.get("decode_tok_s")]
        by = {}
        for r in good:
            by.setdefault(r["category"], []).append(r["decode_tok_s"])
        return median([r["decode_tok_s"] for r in good]), {c: median(v) for c, v in by.items()}

    for row in summary:
        per = []
        for rnd in range(rounds):
            mine, mine_by = medians(row["endpoint"], row["concurrency"], rnd)
            ref, ref_by = medians(first[row["concurrency"]], row["concurrency"], rnd)
            per.append({"round": rnd, "decode_tok_s_p50": mine, "decode_ratio": ratio(mine, ref),
                        "decode_ratio_by_category": {c: ratio(v, ref_by.get(c)) for c, v in mine_by.items()}})
        row["rounds"] = per
        ratios = [p["decode_ratio"] for p in per if p["decode_ratio"] is not None]
        row["decode_ratio_over_rounds"] = ({"median": median(ratios), "min": min(ratios), "max": max(ratios)}
                                           if ratios else None)


def run_serve_bench(cfg: ServeBenchConfig, progress: bool = True) -> dict:
    from ..utils import write_json_atomic, write_text_atomic
    from .offline import machine_info

    if cfg.turns:
        return _run_conversation_bench(cfg, progress)

    prompts = load_prompts(cfg.dataset, cfg.seed)
    out = Path(cfg.out)
    models = [cfg.model or _served_model(u, cfg.api_key) for u in cfg.endpoints]
    n = len(cfg.endpoints)
    for idx in range(n):        # warm-up, untimed
        asyncio.run(_level(ServeBenchConfig(**{**asdict(cfg), "max_tokens": 8}), idx, models[idx], prompts[:1], 1))
    requests, summary = [], []
    waited_s = 0.0
    for c in cfg.concurrency:
        if progress:
            print(f"bench serve: concurrency {c}: {len(prompts)} requests to each of {n} endpoint(s)"
                  f"{', interleaved' if cfg.interleave and n > 1 else ''}", flush=True)
        recs: list[list] = [[] for _ in range(n)]
        durations = [0.0] * n
        # interleaved: rounds of c prompts, each sent to every endpoint before the next round; else one round
        size = c if cfg.interleave and n > 1 else len(prompts)
        for r, lo in enumerate(range(0, len(prompts), size)):
            idxs = list(range(lo, min(lo + size, len(prompts))))
            if progress and cfg.rounds > 1 and round_of(lo, len(prompts), cfg.rounds) != \
                    round_of(max(lo - 1, 0), len(prompts), cfg.rounds):
                print(f"bench serve: round {round_of(lo, len(prompts), cfg.rounds) + 1} of {cfg.rounds}", flush=True)
            for idx in [(r + j) % n for j in range(n)] if cfg.interleave else range(n):
                if cfg.wait_idle:
                    waited_s += wait_until_idle(cfg.idle_max_busy)
                got, duration = asyncio.run(_level(cfg, idx, models[idx], [prompts[i] for i in idxs], c, idxs))
                recs[idx] += got
                durations[idx] += duration
        for idx in range(n):
            for rec in recs[idx]:
                rec["round"] = round_of(rec["prompt_index"], len(prompts), cfg.rounds)
            requests += sorted(recs[idx], key=lambda x: x["prompt_index"])
            summary.append({"endpoint": cfg.labels[idx], "url": cfg.endpoints[idx], "concurrency": c,
                            **summarize_level(recs[idx], durations[idx])})
    add_ratios(summary)
    if cfg.rounds > 1:
        add_rounds(summary, requests, cfg.rounds)
    if len(cfg.endpoints) > 1 and cfg.temperature == 0:
        first = cfg.labels[0]
        for row in summary:
            if row["endpoint"] == first:
                continue
            ref = {r["prompt_index"]: r["text"] for r in requests if r["endpoint"] == first
                   and r["concurrency"] == row["concurrency"] and r["ok"]}
            mine = [r for r in requests if r["endpoint"] == row["endpoint"] and r["concurrency"] == row["concurrency"]
                    and r["ok"] and r["prompt_index"] in ref]
            same = sum(r["text"] == ref[r["prompt_index"]] for r in mine)
            row["identical_to_first"] = same / len(mine) if mine else None
        for row in summary:        # greedy answers of every pair (a server with and without predictions, say)
            texts = {}
            for r in requests:
                if r["concurrency"] == row["concurrency"] and r["ok"]:
                    texts.setdefault(r["endpoint"], {})[r["prompt_index"]] = r["text"]
            mine = texts.get(row["endpoint"], {})
            row["identical_to"] = {}
            for other, theirs in texts.items():
                both = mine.keys() & theirs.keys()
                if other != row["endpoint"] and both:
                    row["identical_to"][other] = sum(mine[i] == theirs[i] for i in both) / len(both)
    import torch

    result = {"config": {**asdict(cfg), "models": models, "num_prompts": len(prompts), "idle_wait_s": waited_s},
              "machine": machine_info(torch.get_num_threads()), "requests": requests, "summary": summary}
    out.mkdir(parents=True, exist_ok=True)
    plots = write_serve_plots(result, out)
    write_text_atomic(out / "report.md", render_serve_report(result, plots))
    write_json_atomic(out / "results.json", result)
    return result


def _run_conversation_bench(cfg: ServeBenchConfig, progress: bool) -> dict:
    import torch

    from ..utils import write_json_atomic, write_text_atomic
    from .conversations import (
        load_conversations,
        render_conversation_report,
        run_conversations,
        summarize_conversations,
    )
    from .offline import machine_info

    if cfg.concurrency != [1]:
        raise SpecDecError("--turns runs one conversation at a time: leave --concurrency at 1")
    convs = load_conversations(cfg.dataset, cfg.turns, cfg.seed)        # bad input before any request
    models = [cfg.model or _served_model(u, cfg.api_key) for u in cfg.endpoints]
    for idx in range(len(cfg.endpoints)):        # warm-up, untimed (a prompt no conversation shares)
        asyncio.run(_level(ServeBenchConfig(**{**asdict(cfg), "max_tokens": 8, "turns": 0}), idx, models[idx],
                           [{"messages": [{"role": "user", "content": "Say hello."}], "category": "warm"}], 1))
    requests = run_conversations(cfg, models, _one, progress)
    result = {"config": {**asdict(cfg), "models": models, "num_conversations": len(convs)},
              "machine": machine_info(torch.get_num_threads()), "requests": requests,
              "summary": summarize_conversations(requests, cfg.labels, cfg.turns)}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "report.md", render_conversation_report(result))
    write_json_atomic(out / "results.json", result)
    return result


