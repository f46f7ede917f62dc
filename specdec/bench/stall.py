"""Does one long prompt stall everyone? Against a running server (ours or any OpenAI-compatible one):

    python -m specdec.bench.stall --endpoint http://127.0.0.1:8000 [--long-chars 18000] [--out DIR]

1. The long prompt alone (`--long-chars` characters of the standard library's pydoc text, ~4.5k tokens):
   its TTFT.
2. A stream is decoding (a 400-token answer); the same long prompt arrives, and one second later a short request
   (`Say hello.`, 32 tokens). Measured: the stream's largest gap between chunks from the long prompt's arrival to
   its first token, the short request's TTFT, and the long prompt's TTFT against step 1's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path


def long_text(chars: int) -> str:
    """Real text that installs with Python: pydoc pages of standard modules, concatenated to `chars`."""
    from .long_prompts import _doc_text

    parts, size = [], 0
    for module in ("json", "csv", "argparse", "statistics", "difflib", "functools", "queue", "contextlib"):
        text = _doc_text(module)
        parts.append(text)
        size += len(text)
        if size >= chars:
            break
    return "".join(parts)[:chars]


async def _stream(client, url: str, model: str, content: str, max_tokens: int, rec: dict) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    rec["sent"], rec["chunks"] = t0, []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            obj = json.loads(line[5:])
            if any((c.get("delta") or {}).get("content") for c in obj.get("choices") or []):
                rec["chunks"].append(time.perf_counter())
    rec["ttft_s"] = rec["chunks"][0] - t0 if rec["chunks"] else None


async def run(url: str, chars: int) -> dict:
    import httpx

    async with httpx.AsyncClient(timeout=900) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        # the two sendings differ in their first words, so a prefix cache cannot serve the second from the first
        text = long_text(chars)
        prompt = lambda tag: f"Summarize this document in two sentences ({tag}).\n\n{text}"   # noqa: E731
        await _stream(client, url, model, "Say hi.", 4, {})                       # warm-up
        alone: dict = {}
        await _stream(client, url, model, prompt("first copy"), 16, alone)
        running, long, short = {}, {}, {}
        task = asyncio.create_task(_stream(client, url, model, "Write a long story about a lighthouse.", 400,
                                           running))
        while len(running.get("chunks", [])) < 10:
            await asyncio.sleep(0.05)
        long_task = asyncio.create_task(_stream(client, url, model, prompt("second copy"), 16, long))
        await asyncio.sleep(1.0)
        await _stream(client, url, model, "Say hello.", 32, short)
        await long_task
        await task
    start, end = long["sent"], long["chunks"][0] if long["chunks"] else long["sent"]
    times = [t for t in running["chunks"] if start - 2.0 <= t <= end + 2.0]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"endpoint": url, "long_chars": chars, "long_ttft_alone_s": alone["ttft_s"],
            "long_ttft_beside_a_stream_s": long["ttft_s"],
            "long_ttft_ratio": long["ttft_s"] / alone["ttft_s"] if alone["ttft_s"] and long["ttft_s"] else None,
            "stream_max_gap_s": max(gaps) if gaps else None, "stream_chunks_meanwhile": len(times),
            "short_ttft_s": short["ttft_s"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.stall", description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--long-chars", type=int, default=18000)
    p.add_argument("--out", default=None, help="directory for stall.json")
    args = p.parse_args(argv)
    result = asyncio.run(run(args.endpoint.rstrip("/").removesuffix("/v1"), args.long_chars))
    for k, v in result.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    if args.out:
        from ..utils import write_json_atomic

        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(args.out) / "stall.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
