"""The product's import graph, read from the source (no module is imported): every `import` and
`from ... import` in toolkit/ and adapters/ (installed as toolkit.adapters), at the top of a module or
inside a function alike, since moving an import from a function to the top must never break the import.

    python tests/import_graph.py            # the circles, one per line; exit 1 when there is one
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"toolkit": ROOT / "toolkit", "toolkit.adapters": ROOT / "adapters"}


def modules() -> dict[str, Path]:
    """{dotted name: file} of every product module."""
    found = {}
    for prefix, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def _resolve(name: str, level: int, module: str, is_package: bool) -> str:
    if not level:
        return name
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def edges(known: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the product modules it imports}. `from a.b import c` names a.b.c when c is a module."""
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        targets = set()
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, module, is_package)
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            else:
                continue
            for name in names:
                while name and name not in known:      # `import toolkit.a.b` reaches toolkit.a.b
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
                groups.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def main() -> int:
    found = circles(edges(modules()))
    for group in found:
        print(" <-> ".join(group))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
