"""The packages stand on floors, and a module imports only from its own floor or those below:
jobs → pipeline → the actor (`workers`) → what the driver and the actor share (`workers.common`) →
strategies. Every import counts, those inside functions and under `TYPE_CHECKING` too: an import
deferred into a function still ties the two modules together, and hides a loop until someone moves it
to the top. A loop between modules of one floor fails as well."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jobs", "pipeline", "workers", "strategies")

# Highest first; a module stands on the floor of the longest of these that names it or a package above it.
FLOORS = ("jobs", "pipeline", "workers", "workers.common", "strategies")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _modules()


def _imported(name: str, path: Path) -> list[tuple[str, int]]:
    """(project module, line) of every import in the module at `path`, wherever it stands in the file: a
    name imported from a package counts as its submodule when it is one, else as the package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((submodule if submodule in MODULES else base, node.lineno))
    imports = []
    for target, line in found:
        while target and target not in MODULES:  # `import torch`, or a name of a project module
            target = target.rpartition(".")[0]
        if target and target != name:
            imports.append((target, line))
    return imports


GRAPH = {name: _imported(name, path) for name, path in MODULES.items()}


def _floor(module: str) -> int:
    """0 for the highest floor (`jobs`), larger for lower ones."""
    package = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS.index(package)


def _loops(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module of an import graph (Tarjan's
    algorithm, iterative: no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target, _ in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
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
                        loops.append(sorted(component))
    return loops


def test_imports_inside_functions_count_and_loops_are_found():
    # `GeneratorActor` imports the generator in its constructor only.
    assert "workers.generator" in {target for target, _ in GRAPH["workers.actor"]}
    assert _floor("workers.common.spec") > _floor("workers.generator") > _floor("pipeline.driver")
    looped = {"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1), ("d", 1)], "d": []}
    assert _loops(looped) == [["a", "b", "c"]]


@pytest.mark.parametrize("floor", FLOORS)
def test_no_module_imports_from_a_higher_floor(floor: str):
    upward = [
        f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}"
        for name, imports in GRAPH.items()
        if FLOORS[_floor(name)] == floor
        for target, line in imports
        if _floor(target) < _floor(name)
    ]
    assert upward == []


def test_no_modules_import_each_other_in_a_loop():
    assert _loops(GRAPH) == []
