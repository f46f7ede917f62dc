"""Long-context requests from text every Python installs: retrieval questions over ~2k-token documents (the
standard library's own documentation, as `pydoc` renders it) and edits of 100+-line modules (the standard
library's source). The short built-in prompts never show what a long context costs a speculative step: the
draft's prompt catch-up, attention over the context per verified row.
"""
from __future__ import annotations

import importlib
import inspect
import pydoc

DOC_CHARS = 9000            # 1.9-2.3k tokens of pydoc text with the Qwen2.5 tokenizer
SOURCE_CHARS = 11000        # a module's source is cut at a line boundary past this (at most ~2.4k tokens)

# (module, question): each answer is in the first DOC_CHARS characters of the module's pydoc text (the anchor
# string must be there; `long_prompts` checks it)
RETRIEVAL = [
    ("json", "sort_keys=True", "Using only the documentation above: how do I serialize a dict to a JSON string with "
                               "its keys sorted and an indentation of four spaces? Show the call and explain each "
                               "argument."),
    ("csv", "QUOTE_NONNUMERIC", "According to the documentation above, what do the QUOTE_* constants mean, and what "
                                "does QUOTE_NONNUMERIC do for the reader and for the writer?"),
    ("argparse", "nargs", "From the documentation above, explain what the `nargs` argument of add_argument accepts "
                          "and give one example for each accepted value."),
    ("statistics", "median_grouped", "The document above lists the averages and measures of central location. "
                                     "Which functions does it name, and what is each one for?"),
    ("difflib", "HtmlDiff", "Summarize the classes that the document above describes and say which one to use to "
                            "show a side-by-side HTML comparison of two files."),
    ("functools", "lru_cache", "Based on the documentation above, how does lru_cache decide what to evict, what do "
                               "its maxsize and typed parameters do, and how do I see its hit statistics?"),
    ("queue", "task_done", "According to the documentation above, how do a producer and its consumers use "
                           "task_done() and join() together, and what happens if task_done() is called too often?"),
]

# (module, instruction): a whole module, asked to be given back with one mechanical change
EDITS = [
    ("bisect", "Add type hints to every function signature in this module. Reply with the complete updated file "
               "and nothing else."),
    ("colorsys", "Rename the function `rgb_to_hsv` to `rgb_to_hsv_tuple` and `hsv_to_rgb` to `hsv_to_rgb_tuple` "
                 "everywhere (definitions, __all__ and docstrings). Reply with the complete updated file."),
    ("fnmatch", "Replace every use of `os.path.normcase` with a module-level helper `_normcase` that calls it, "
                "defined after the imports. Reply with the complete updated file."),
    ("sched", "Rename the class `scheduler` to `Scheduler` and keep `scheduler = Scheduler` as an alias at the end "
              "of the module. Reply with the complete updated file."),
    ("graphlib", "Add type hints to every method of TopologicalSorter. Reply with the complete updated file and "
                 "nothing else."),
    ("queue", "Rename the class `LifoQueue` to `StackQueue` everywhere and keep `LifoQueue = StackQueue` as an "
              "alias. Reply with the complete updated file."),
]


def _doc_text(module: str) -> str:
    """The module's pydoc text without the header lines that name this machine's paths or the docs URL."""
    text = pydoc.render_doc(importlib.import_module(module), renderer=pydoc.plaintext)
    start = text.find("DESCRIPTION")
    text = text[start if start >= 0 else 0:]
    end = text.find("\nFILE\n")
    return text[:end] if end >= 0 else text


def _cut(text: str, limit: int) -> str:
    """`text` up to the first line break at or past `limit` characters."""
    if len(text) <= limit:
        return text
    nl = text.find("\n", limit)
    return text[:nl if nl >= 0 else limit]


def long_prompts() -> list[dict]:
    """Thirteen requests: `rag-long` (questions over pydoc text) and `code-edit-long` (whole-module edits)."""
    out = []
    for module, anchor, question in RETRIEVAL:
        doc = _cut(_doc_text(module), DOC_CHARS)
        if anchor not in doc:                  # a Python whose docs moved the answer out of the excerpt
            raise RuntimeError(f"long prompts: '{anchor}' is not in the first {DOC_CHARS} characters of "
                               f"pydoc {module}")
        out.append({"category": "rag-long", "messages": [
            {"role": "system", "content": "Answer from the document the user gives you."},
            {"role": "user", "content": f"Document: the documentation of Python's `{module}` module.\n\n{doc}\n\n"
                                        f"Question: {question}"}]})
    for module, instruction in EDITS:
        source = _cut(inspect.getsource(importlib.import_module(module)), SOURCE_CHARS)
        out.append({"category": "code-edit-long", "messages": [
            {"role": "user", "content": f"{instruction}\n\n```python\n{source}```"}]})
    return out
