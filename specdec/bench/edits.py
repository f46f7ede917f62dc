"""Code edits with their predicted output: `bench serve --dataset edits[:N]`.

Each request hands the model one function from Python's standard library (text every Python install has, and
not among the built-in prompts or the heads' training sources) and asks for a small edit that leaves most of it as
it is; its `prediction` is the function as sent, fenced as the answer will be: what a code editor sends as
OpenAI's Predicted Outputs. `bench serve --prediction LABEL` sends it to that endpoint; every other endpoint gets
the same request without it.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

MODULES = ("shlex", "fnmatch", "colorsys", "bisect", "heapq", "calendar", "gettext", "netrc", "quopri", "uu",
           "tabnanny", "difflib", "ftplib", "mailbox", "imaplib", "smtplib")
EDITS = (
    "Rename the function to `{name}_v2` and change nothing else.",
    "Add type hints to the function's parameters and return value; change nothing else.",
    "Add a one-line comment above its first statement saying what the function does; change nothing else.",
    "Rename its first parameter to `arg0` everywhere in the function; change nothing else.",
)
MIN_LINES, MAX_LINES = 12, 45


def _functions(module: str) -> list[tuple[str, str]]:
    import importlib

    try:
        source = inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return []
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.args.args and not node.name.startswith("_"):
            text = ast.get_source_segment(source, node)
            if text and MIN_LINES <= text.count("\n") + 1 <= MAX_LINES:
                out.append((node.name, textwrap.dedent(text)))
    return out


def load_edits(n: int) -> list[dict]:
    """n edit requests, the functions taken in module order, each with its `prediction`."""
    out = []
    for module in MODULES:
        for name, code in _functions(module):
            edit = EDITS[len(out) % len(EDITS)].format(name=name)
            out.append({"category": "code-edit", "task_id": f"{module}.{name}",
                        "messages": [{"role": "user", "content": f"```python\n{code}\n```\n{edit} Reply with the "
                                      "whole function in one ```python block and nothing else."}],
                        "prediction": f"```python\n{code}\n```"})
            if len(out) == n:
                return out
    return out
