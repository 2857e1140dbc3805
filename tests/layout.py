"""The package's import graph, read from its source (tests/test_layout.py checks it): each
module and what it imports when it runs, including imports inside functions and leaving out
those under `if TYPE_CHECKING:` (they never run). A `from package import name` imports the
module `package.name` when that is a module, else `package`."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "stream_dedup"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.stmt]:
    """The import statements of a module, less those in `if TYPE_CHECKING:` blocks."""
    found: list[ast.stmt] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                walk(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return found


@cache
def graph() -> dict[str, dict[str, set[str]]]:
    """module -> {imported module: the names it takes from it}."""
    mods = modules()
    edges: dict[str, dict[str, set[str]]] = {}
    for name, path in mods.items():
        out: dict[str, set[str]] = {}
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in mods:
                        out.setdefault(alias.name, set())
                continue
            assert isinstance(node, ast.ImportFrom)
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in mods:
                    out.setdefault(f"{base}.{alias.name}", set())
                elif base in mods:
                    out.setdefault(base, set()).add(alias.name)
        out.pop(name, None)
        edges[name] = out
    return edges


def floors() -> dict[str, int]:
    """Each module's floor: 1 + the highest floor of what it imports (a leaf is on floor 1).
    ValueError names a cycle, which no floor plan can draw."""
    edges = graph()
    floor: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> int:
        if module in floor:
            return floor[module]
        if module in path:
            raise ValueError("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        path.append(module)
        floor[module] = 1 + max((visit(m) for m in edges[module]), default=0)
        path.pop()
        return floor[module]

    for module in edges:
        visit(module)
    return floor
