"""Four ~1k-token questions over pydoc text (the `rag-long` prompts' modules, each document cut near 4,400
characters), as a JSONL dataset for `specdec bench serve --dataset PATH` (the issue's bound: the first token of a
1k-token prompt no later than vLLM's CPU build gets it on the same machine).

    .venv/bin/python docs/benchmarks/amx/prompts_1k.py OUT.jsonl
"""
from __future__ import annotations

import importlib
import json
import pydoc
import sys

MODULES = [("json", "What does the `indent` argument of json.dumps do?"),
           ("textwrap", "What does textwrap.dedent do with lines that hold only whitespace?"),
           ("shlex", "How does shlex.quote make a string safe for a shell?"),
           ("fractions", "How does Fraction.limit_denominator choose its result?")]
CHARS = 4400


def main() -> None:
    with open(sys.argv[1], "w") as f:
        for module, question in MODULES:
            doc = pydoc.render_doc(importlib.import_module(module), renderer=pydoc.plaintext)
            cut = doc.find("\n", CHARS)
            doc = doc[:cut if cut >= 0 else CHARS]
            f.write(json.dumps({"category": "rag-1k", "messages": [
                {"role": "system", "content": "Answer from the document the user gives you."},
                {"role": "user", "content": f"Document: the documentation of Python's `{module}` module.\n\n{doc}\n\n"
                                            f"Question: {question}"}]}) + "\n")


if __name__ == "__main__":
    main()
