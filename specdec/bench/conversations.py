"""`specdec bench serve --turns N`: multi-turn conversations, each turn resending the whole history, as every chat
client does. What it measures is what a prefix cache is for: TTFT per turn (the history grows; a server that keeps
what it computed answers from turn 2 on after only the new message).

Conversations: `builtin` (a standard-library module's source, then questions about it: the code-review chat a
coding assistant sees) or `sharegpt[:N]` (ShareGPT V3 conversations with at least N human turns; their human
messages are sent in order, and each endpoint's own answers go back as the assistant's turns).

Interleaved (the default), each turn goes to every endpoint in turn (the order rotating from turn to turn) before
the next turn of the conversation: while one server answers, the other is idle, as a server is while its user
reads and types. `--think-time S` pauses S seconds after every answer, before the next request to any endpoint: the
reading time, during which a server may finish background work (specdec settles its prefix cache) without it
landing in another server's measurement. `--no-interleave` with no think time runs each endpoint through a whole
conversation back to back (the next turn sent the moment the last one ends: an agent loop).
"""
from __future__ import annotations

import asyncio
import random

from ..errors import SpecDecError
from .datasets import module_source
from .summary import median, percentile

SOURCE_CHARS = 2600             # a module's first ~60 lines (~700 tokens with the Qwen2.5 tokenizer)
MODULES = ("bisect", "colorsys", "shlex", "textwrap")
QUESTIONS = (
    "Explain briefly what this module does.",
    "Which function would you test first, and why?",
    "Write a short unit test for that function.",
    "Is there an edge case the code does not handle? Be brief.",
    "Suggest one improvement to its naming or docstrings.",
    "Summarize our discussion in three bullet points.",
    "Which part of the module would be hardest to port to another language?",
    "Thanks. Anything else worth knowing about it?",
)
SHAREGPT_MAX_CHARS = 2000


def load_conversations(source: str, turns: int, seed: int = 0) -> list[dict]:
    """[{"id": str, "category": str, "user": [first message, second, ...]}] with at least `turns` user messages."""
    if turns < 1:
        raise SpecDecError(f"--turns must be >= 1, got {turns}")
    if turns > len(QUESTIONS) and source == "builtin":
        raise SpecDecError(f"the builtin conversations have {len(QUESTIONS)} turns; asked for {turns}")
    if source == "builtin":
        return [{"id": f"code-{m}", "category": "code-review",
                 "user": [f"Here is a Python module:\n```python\n{module_source(m, SOURCE_CHARS)}\n```\n{QUESTIONS[0]}",
                          *QUESTIONS[1:turns]]} for m in MODULES]
    if source == "sharegpt" or source.startswith("sharegpt:"):
        from .datasets import sharegpt_conversations, source_count

        n = source_count(source, 4)
        found = []
        for conv in sharegpt_conversations():
            human = [(t.get("value") or "").strip() for t in conv.get("conversations") or []
                     if isinstance(t, dict) and t.get("from") == "human"]
            if len(human) >= turns and all(8 <= len(h) <= SHAREGPT_MAX_CHARS for h in human[:turns]):
                found.append({"id": str(conv.get("id", len(found))), "category": "sharegpt", "user": human[:turns]})
            if len(found) >= 50 * n:
                break
        if len(found) < n:
            raise SpecDecError(f"sharegpt has {len(found)} conversations with {turns} usable human turns; "
                               f"asked for {n}")
        return random.Random(seed).sample(found, n)
    raise SpecDecError(f"--turns takes --dataset builtin or sharegpt[:N], got '{source}'")


async def _turn(one, client, url: str, model: str, messages: list[dict], cfg, idx: int, seed: int) -> dict:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    body = {"model": model, "messages": messages, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
            "seed": seed, "stream": True, "stream_options": {"include_usage": True}, **cfg.extra_body[idx]}
    return await one(client, url, body, headers)


def run_conversations(cfg, models: list[str], one, progress: bool = True) -> list[dict]:
    """Every conversation's turns on every endpoint; one record per (endpoint, conversation, turn)."""
    import httpx

    convs = load_conversations(cfg.dataset, cfg.turns, cfg.seed)
    n = len(cfg.endpoints)

    async def go() -> list[dict]:
        recs = []
        async with httpx.AsyncClient(timeout=cfg.timeout_s) as client:
            for c, conv in enumerate(convs):
                histories: list[list[dict]] = [[] for _ in range(n)]
                if progress:
                    print(f"bench serve: conversation {c + 1}/{len(convs)} ({conv['id']}), {cfg.turns} turns",
                          flush=True)
                schedule = ([(t, (t + c + j) % n) for t in range(cfg.turns) for j in range(n)] if cfg.interleave
                            else [(t, j) for j in range(n) for t in range(cfg.turns)])
                for t, idx in schedule:
                    histories[idx].append({"role": "user", "content": conv["user"][t]})
                    rec = await _turn(one, client, cfg.endpoints[idx], models[idx], histories[idx], cfg, idx,
                                      cfg.seed + c)
                    histories[idx].append({"role": "assistant", "content": rec["text"]})
                    if cfg.think_time_s:
                        await asyncio.sleep(cfg.think_time_s)
                    recs.append({"endpoint": cfg.labels[idx], "conversation": conv["id"], "turn": t + 1,
                                 "category": conv["category"], **rec})
        return recs

    return asyncio.run(go())


def summarize_conversations(recs: list[dict], labels: list[str], turns: int) -> list[dict]:
    """Per endpoint: TTFT by turn (P50), over turns 2.. (P50, P90), turn 1's, decode tok/s and cached tokens."""
    rows = []
    for label in labels:
        mine = [r for r in recs if r["endpoint"] == label and r["ok"]]
        later = [r["ttft_s"] for r in mine if r["turn"] >= 2]
        cached = [r["cached_tokens"] for r in mine if r["turn"] >= 2 and r.get("cached_tokens") is not None]
        prompt = [r["prompt_tokens"] for r in mine if r["turn"] == turns and r.get("prompt_tokens")]
        rows.append({
            "endpoint": label, "requests": len(mine),
            "errors": sum(1 for r in recs if r["endpoint"] == label and not r["ok"]),
            "ttft_by_turn_p50_s": [median([r["ttft_s"] for r in mine if r["turn"] == t]) for t in range(1, turns + 1)],
            "ttft_turn1_p50_s": median([r["ttft_s"] for r in mine if r["turn"] == 1]),
            "ttft_later_p50_s": median(later), "ttft_later_p90_s": percentile(later, 90),
            "decode_tok_s_p50": median([r["decode_tok_s"] for r in mine if r["decode_tok_s"]]),
            "cached_tokens_mean_later": sum(cached) / len(cached) if cached else None,
            "prompt_tokens_last_turn_p50": median(prompt),
        })
    first = {r["conversation"]: {} for r in recs}
    for r in recs:
        if r["endpoint"] == labels[0] and r["ok"]:
            first[r["conversation"]][r["turn"]] = r["text"]
    for row in rows[1:]:
        mine = [r for r in recs if r["endpoint"] == row["endpoint"] and r["ok"]
                and r["turn"] in first[r["conversation"]]]
        row["identical_to_first"] = (sum(r["text"] == first[r["conversation"]][r["turn"]] for r in mine) / len(mine)
                                     if mine else None)
    return rows


def render_conversation_report(result: dict) -> str:
    cfg, rows = result["config"], result["summary"]
    ms = lambda x: "-" if x is None else f"{x * 1000:.0f}"   # noqa: E731
    num = lambda x, f: "-" if x is None else format(x, f)     # noqa: E731
    lines = [f"# specdec bench serve: {cfg['turns']}-turn conversations ({cfg['dataset']})", "",
             f"{cfg['num_conversations']} conversations, max_tokens {cfg['max_tokens']}, temperature "
             f"{cfg['temperature']}, {'interleaved by turn' if cfg['interleave'] else 'back to back'}, think time "
             f"{cfg['think_time_s']:g} s. TTFT in ms; identical: answers equal to the first endpoint's.",
             "", "| endpoint | turn 1 | turns 2-" + str(cfg["turns"]) + " P50 | P90 | "
             + " | ".join(f"turn {t}" for t in range(1, cfg["turns"] + 1))
             + " | decode tok/s P50 | cached tokens (turns 2+) | last prompt tokens | identical |",
             "|---|---|---|---|" + "---|" * cfg["turns"] + "---|---|---|---|"]
    for r in rows:
        cells = [r["endpoint"], ms(r["ttft_turn1_p50_s"]), ms(r["ttft_later_p50_s"]), ms(r["ttft_later_p90_s"]),
                 *(ms(x) for x in r["ttft_by_turn_p50_s"]), num(r["decode_tok_s_p50"], ".2f"),
                 num(r["cached_tokens_mean_later"], ".0f"), num(r["prompt_tokens_last_turn_p50"], ".0f"),
                 num(r.get("identical_to_first"), ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
