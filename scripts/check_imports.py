"""Checks that imports run one way: sims < policies < embodied < real_robot < benchmarks.

    python scripts/check_imports.py [ROOT]

Reads every import statement (module level and inside functions: a lazy import is still a
dependency) of the five packages and reports
  1. an import from a lower floor to a higher one (``embodied`` importing ``real_robot``), and
  2. import circles: modules that reach each other through their imports (a package counts as
     its ``__init__``, so ``policies/checkpoint.py`` importing ``from policies import X`` while
     ``policies/__init__.py`` imports ``checkpoint`` is a circle).
Exits 1 when there is either, 0 otherwise. Stdlib only.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

FLOORS = {"sims": 1, "policies": 2, "embodied": 3, "real_robot": 4, "benchmarks": 5}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, module: str) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of every import in ``path``; ``from a import b`` gives ``a`` and ``a.b``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            names.append((name, node.lineno))
            names += [(f"{name}.{alias.name}", node.lineno) for alias in node.names]
    return names


def import_graph(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The module graph of the five packages and the upward imports found on the way."""
    files = {
        module_name(root, p): p for top in FLOORS if (root / top).is_dir() for p in sorted((root / top).rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    upward: list[str] = []
    for module, path in files.items():
        floor = FLOORS[module.split(".")[0]]
        deps: set[str] = set()
        for name, line in imported_names(path, module):
            top = name.split(".")[0]
            if top not in FLOORS:
                continue
            parts = name.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in files), None)
            if target is not None and target != module:
                deps.add(target)
            if FLOORS[top] > floor:
                upward.append(
                    f"{path.relative_to(root)}:{line}: {module} (floor {floor}) imports {name} (floor {FLOORS[top]})"
                )
        graph[module] = deps
    return graph, sorted(set(upward))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent)
    graph, upward = import_graph(root)
    loops = circles(graph)
    for line in upward:
        print(f"upward import: {line}")
    for loop in loops:
        print(f"import circle ({len(loop)} modules): {' <-> '.join(loop)}")
    print(f"{len(graph)} modules: {len(upward)} upward imports, {len(loops)} circles")
    return 1 if upward or loops else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
