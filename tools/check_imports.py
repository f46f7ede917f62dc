"""Check specdec's import layers: imports point down the layer order below, no modules import each other, and
no module reads another module's private attributes (`obj._name` defined elsewhere).

    python tools/check_imports.py [PACKAGE_DIR]      (default: the specdec/ beside this tools/ folder)

Prints one line per violation and exits 1, or one summary line and exits 0. Every `import` and `from ... import`
counts, at module level or inside a function (a lazy import still ties the two modules together); only
`from __future__` and imports under `if TYPE_CHECKING:` are left out. Standard library only (ast), so it runs
before anything is installed.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# Lowest first. A module may import its own layer (if that makes no cycle) or any layer below, never one above.
# An entry names a module or a package (every module under it); the longest entry that matches wins, and the
# package itself (specdec/__init__.py) matches only its own entry. A module no entry covers is a violation:
# a new top-level module must be placed here on purpose.
LAYERS: list[tuple[str, ...]] = [
    # leaves: the error type, file helpers, GGUF metadata reading (tokenizer and models/ both read GGUF files)
    ("specdec.errors", "specdec.utils", "specdec.gguf_file"),
    # pure functions over tensors (torch only): logits processing, verification, grammar masks
    ("specdec.sampling",),
    # plain data: the request dataclass (SamplingParams carries a sampling.grammar spec)
    ("specdec.sampling_params",),
    # text <-> token ids; knows no model
    ("specdec.tokenizer", "specdec.tokenizer_gguf"),
    # linear methods swapped into a model at load time; they know nothing of the transformer
    ("specdec.models.quantization", "specdec.models.packed_linear", "specdec.models.quant",
     "specdec.models.hugepages"),
    # weights, transformer, heads, KV caches; nothing about drafts or requests
    ("specdec.models",),
    # drafts from models and n-grams, each method's declaration beside its proposer, the method table; no engine
    ("specdec.proposers",),
    # the speculative config (resolves a method's defaults from the table) and per-request stats
    ("specdec.config", "specdec.metrics"),
    # choice of method and k; measure.py times real proposers and forwards to fit the cost model
    ("specdec.policy",),
    # the step loop over everything below
    ("specdec.engine",),
    # the offline API: its arguments, the models they name loaded, the engine built over them
    ("specdec.engine_args", "specdec.loading", "specdec.llm"),
    # the public surface (specdec/__init__.py)
    ("specdec",),
    # offline tools that drive LLM; train reads bench's dataset readers
    ("specdec.bench", "specdec.train"),
    # the HTTP API
    ("specdec.server",),
    # every entry point
    ("specdec.cli", "specdec.cli_args"),
]

# (importer, imported) -> why an upward import is allowed. Keep this short: most belong below, or moved.
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    importer: str          # dotted module names
    imported: str
    path: Path             # the importer's file
    line: int
    lazy: bool             # inside a function


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is named by its __init__.py)."""
    package_dir = Path(package_dir)
    root = package_dir.name
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = (root, *path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package's module that `import name` loads: name itself, or its longest known prefix."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of one module that land in the package (TYPE_CHECKING-guarded ones left out)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    out: list[Import] = []
    seen: set[tuple[str, int]] = set()

    def add(target: str | None, node: ast.stmt, lazy: bool) -> None:
        if target is not None and target != module and (target, node.lineno) not in seen:
            seen.add((target, node.lineno))
            out.append(Import(module, target, path, node.lineno, lazy))

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.orelse:             # only the guarded branch is left out
                    visit(ast.Module(body=[sub], type_ignores=[]), lazy)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(_resolve(alias.name, modules), child, lazy)
            elif isinstance(child, ast.ImportFrom):
                if child.module == "__future__":
                    continue
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - child.level + 1])
                    source = f"{base}.{child.module}" if child.module else base
                else:
                    source = child.module or ""
                for alias in child.names:            # `from pkg import submodule` imports the submodule
                    submodule = f"{source}.{alias.name}"
                    add(submodule if submodule in modules else _resolve(source, modules), child, lazy)
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), False)
    return out


def import_graph(package_dir: Path) -> tuple[dict[str, Path], list[Import]]:
    modules = module_names(package_dir)
    return modules, [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]


def layer_of(module: str, layers: list[tuple[str, ...]]) -> int | None:
    root = module.partition(".")[0]
    best, best_len = None, -1
    for index, entries in enumerate(layers):
        for entry in entries:
            matches = module == entry or (entry != root and module.startswith(entry + "."))
            if matches and len(entry) > best_len:
                best, best_len = index, len(entry)
    return best


def find_cycles(imports: list[Import]) -> list[list[Import]]:
    """One cycle (as its chain of imports) for every group of modules that reach each other (Tarjan's SCCs)."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        edges.setdefault(imp.importer, {}).setdefault(imp.imported, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def strongconnect(v: str) -> None:      # recursion depth is bounded by the package's module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)

    cycles = []
    for group in groups:
        members, start = set(group), min(group)
        # breadth-first from start back to start, inside the group: the shortest cycle through start
        parent: dict[str, Import] = {}
        frontier = [start]
        while frontier and start not in parent:
            nxt = []
            for v in frontier:
                for w, imp in sorted(edges.get(v, {}).items()):
                    if w in members and w not in parent:
                        parent[w] = imp
                        nxt.append(w)
            frontier = nxt
        chain = [parent[start]]
        while chain[-1].importer != start:
            chain.append(parent[chain[-1].importer])
        cycles.append(chain[::-1])
    return cycles


# private names of other libraries that we call on purpose (their documented ops are private-named)
FOREIGN_PRIVATE_ROOTS = ("torch",)


def private_reads(path: Path) -> list[tuple[int, str]]:
    """(line, expression) for each `obj._name` in a module where obj is not self/cls and `_name` is not defined in
    that module: a private attribute of another module's object."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        root = node.value
        while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
            root = root.func if isinstance(root, ast.Call) else root.value
        if isinstance(root, ast.Name) and (root.id in ("self", "cls") and root is node.value
                                           or root.id in FOREIGN_PRIVATE_ROOTS):
            continue
        if node.attr not in own:
            out.append((node.lineno, ast.unparse(node)))
    return out


def check(package_dir: Path, layers: list[tuple[str, ...]] = LAYERS,
          allowed: dict[tuple[str, str], str] = ALLOWED) -> list[str]:
    """Every violation, one line each: cycles, modules outside the table, upward imports, private attributes of
    another module's objects read."""
    package_dir = Path(package_dir)
    modules, imports = import_graph(package_dir)

    def rel(imp: Import) -> str:
        return f"{imp.path.relative_to(package_dir.parent)}:{imp.line}"

    problems = []
    for chain in find_cycles(imports):
        path = " -> ".join([chain[0].importer] + [imp.imported for imp in chain])
        where = ", ".join(rel(imp) for imp in chain)
        problems.append(f"import cycle: {path} ({where})")
    for module in modules:
        if layer_of(module, layers) is None:
            problems.append(f"{modules[module].relative_to(package_dir.parent)}: {module} is in no layer of the table")
    edges = {(imp.importer, imp.imported) for imp in imports}
    for importer, imported in sorted(set(allowed) - edges):
        problems.append(f"stale exception in ALLOWED: {importer} no longer imports {imported}")
    for imp in imports:
        low, high = layer_of(imp.importer, layers), layer_of(imp.imported, layers)
        if low is None or high is None or high <= low or (imp.importer, imp.imported) in allowed:
            continue
        problems.append(f"{rel(imp)}: upward import{' (in a function)' if imp.lazy else ''}: {imp.importer} "
                        f"(layer {low}: {layers[low][0]}) imports {imp.imported} (layer {high}: {layers[high][0]})")
    for path in modules.values():
        for line, expr in private_reads(path):
            problems.append(f"{path.relative_to(package_dir.parent)}:{line}: private attribute of another module's "
                            f"object: {expr}")
    return problems


def main(argv: list[str]) -> int:
    package_dir = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "specdec"
    problems = check(package_dir)
    for line in problems:
        print(line)
    if problems:
        return 1
    modules, imports = import_graph(package_dir)
    print(f"{package_dir.name}: {len(modules)} modules, {len(imports)} imports, no cycles, none upward, no private "
          "attribute read across modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
