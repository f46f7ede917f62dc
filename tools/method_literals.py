"""Count method-name string literals outside the method table (specdec/proposers/) and the methods' own files.

    python tools/method_literals.py [--max N]        (default: at most 10)

A method is declared once, beside its proposer (specdec/proposers/), and every other module asks the table
(proposers/registry.METHOD_TABLE) by kind, need or name. This lists every place a declared method's name is still
spelled out as a string elsewhere, with the reason it is allowed (ALLOWED, below); it exits 1 when one has no reason or
when there are more than --max. "none" and "auto" are common words (a quantization scheme, a tool_choice, an
ops implementation), so they count only where a method is meant: compared with or passed as a `method`/`spec`.
Dict keys and subscripts (field names of a record) and docstrings are not counted.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "specdec"
# the method table and the methods' own files: proposers (declarations) and the learned heads' model files
OWN = ("proposers/", "models/eagle3.py", "models/eagle1.py", "models/medusa.py")
COMMON_WORDS = ("none", "auto")
# (file relative to specdec/, literal) -> why it stays
ALLOWED: dict[tuple[str, str], str] = {
    ("models/heads.py", "eagle"): "a head's config.json as others write it (its architectures name, lower-cased)",
    ("models/heads.py", "medusa"): "a head's config.json as the Medusa authors write it (model_type)",
    ("server/protocol.py", "suffix"): "OpenAI's completions parameter `suffix` (text insertion), not the method",
}


def _method_context(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """The literal stands for a method: compared with, or passed as, something named method/spec."""
    parent = parents.get(node)
    if isinstance(parent, ast.keyword):
        return parent.arg in ("method", "spec")
    if isinstance(parent, ast.AnnAssign | ast.Assign):              # method: str = "none"
        targets = [parent.target] if isinstance(parent, ast.AnnAssign) else parent.targets
        return any("method" in ast.unparse(t) for t in targets)
    if isinstance(parent, ast.Compare):
        others = [parent.left, *parent.comparators]
        return any("method" in ast.unparse(o) for o in others if o is not node)
    if isinstance(parent, (ast.Tuple, ast.List, ast.Set)) and isinstance(parents.get(parent), ast.Compare):
        return _method_context(parent, parents)
    return False


def find(root: Path, names: set[str]) -> list[tuple[str, int, str]]:
    """(file, line, literal) for every counted literal under `root`."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(rel == o or (o.endswith("/") and rel.startswith(o)) for o in OWN):
            continue
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names):
                continue
            parent = parents.get(node)
            if id(node) in docstrings or isinstance(parent, ast.JoinedStr):
                continue
            if isinstance(parent, ast.Dict) and any(k is node for k in parent.keys):
                continue
            if isinstance(parent, ast.Subscript) and parent.slice is node:     # a record's field: r["draft"]
                continue
            if node.value in COMMON_WORDS and not _method_context(node, parents):
                continue
            hits.append((rel, node.lineno, node.value))
    return hits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=10)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT.parent))
    from specdec.proposers.registry import METHOD_TABLE

    builtin = {m.name for m in METHOD_TABLE.values() if m.origin == "specdec"}
    hits = find(ROOT, builtin)
    bad = [h for h in hits if (h[0], h[2]) not in ALLOWED]
    for rel, line, lit in hits:
        why = ALLOWED.get((rel, lit))
        print(f"specdec/{rel}:{line}: '{lit}'" + (f"  ({why})" if why else "  NO REASON"))
    print(f"{len(hits)} method-name literal(s) outside the table and the methods' own files (at most {args.max}); "
          f"{len(bad)} without a reason")
    return 1 if bad or len(hits) > args.max else 0


if __name__ == "__main__":
    sys.exit(main())
