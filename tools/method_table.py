"""The README's table of speculative methods, from the method table (proposers/registry.METHOD_TABLE).

    python tools/method_table.py            print it
    python tools/method_table.py --write    replace the table between README.md's markers

Built-in methods only (a plugin's method shows in its own README); tests/test_methods.py checks that README.md
holds what this prints.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- method-table:begin (tools/method_table.py --write) -->", "<!-- method-table:end -->"
NEEDS = {"": "-", "draft_model": "a draft model", "head": "a learned head"}


def table() -> str:
    sys.path.insert(0, str(REPO))
    from specdec.proposers.registry import METHOD_TABLE, method_names

    rows = ["| method | kind | default k | trees | needs | what it does |", "|---|---|---|---|---|---|"]
    for name in method_names():
        m = METHOD_TABLE[name]
        if m.origin != "specdec":
            continue
        k = str(m.default_k) + (" (the most it picks)" if m.kind == "policy" else "") if m.kind != "plain" else "-"
        rows.append(f"| `{m.name}` | {m.kind} | {k} | {'yes' if m.tree else '-'} | {NEEDS[m.needs]} | {m.summary} |")
    return "\n".join(rows)


def readme_table(text: str) -> str:
    """What README.md holds between the markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def main(argv: list[str]) -> int:
    if "--write" in argv:
        path = REPO / "README.md"
        text = path.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        path.write_text(text[:start] + "\n" + table() + "\n" + text[end:])
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
