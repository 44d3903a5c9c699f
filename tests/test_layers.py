"""The house without circles: interop's modules import each other in one
direction only, lower layers never reaching up (module-level and lazy
imports alike)."""

from __future__ import annotations

import ast
import pathlib

import interop

ROOT = pathlib.Path(interop.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the interop modules it imports, anywhere in the file.

    A package's ``__init__`` is its facade: it may import its own submodules
    (the implicit "a submodule's package runs first" is not an edge), but a
    module that imports a package's ``__init__`` by name depends on all of it.
    """
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                stem = f"{base}.{node.module}" if node.level and node.module else base
                if not node.level:
                    stem = node.module or ""
                targets = [f"{stem}.{a.name}" for a in node.names]
                if node.module:  # `from . import name` imports name (a submodule, or from __init__)
                    targets.append(stem)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "interop":
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_real_imports():
    graph = _imports()
    assert "interop.transfer" in graph["interop.exchange._numpy"]
    assert "interop.pipeline.start" in graph["interop.transfer"]
    assert "interop.pipeline.schedule" in graph["interop.pipeline.start"]
    assert "interop.pipeline.cuda" in graph["interop.pipeline.start"]  # a lazy import counts too


def test_no_production_module_knows_the_emulated_device():
    """The emulated device plugs in through the device interface (it registers
    its array types); nothing outside interop.testing imports it or asks for it."""
    graph = _imports()
    for module, imported in graph.items():
        if not module.startswith("interop.testing"):
            assert not any(m.startswith("interop.testing") for m in imported), module
    for path in ROOT.rglob("*.py"):
        if "testing" not in path.relative_to(ROOT).parts:
            assert "__interop_backend__" not in path.read_text(), path


def test_no_import_cycle_inside_interop():
    assert _cycles(_imports()) == []


def test_lower_layers_never_import_upper_ones():
    graph = _imports()
    upper = {"interop.transfer", "interop.dask", "interop.allocator"}
    upper |= {m for m in graph if m.startswith("interop.exchange")}
    for module, imported in graph.items():
        if module.startswith("interop.pipeline") or module == "interop.arrays":
            assert not imported & upper, (module, imported & upper)
            assert not any(m.startswith("interop.io") for m in imported), module
    assert not any(m.startswith("interop.pipeline") for m in graph["interop.arrays"])
