"""No import cycles between hf_fedflat's modules, function-local imports included.

Every ``import`` / ``from ... import`` statement of every module (at any depth of the file, so an import
hidden inside a function counts) is an edge; a package's ``__init__`` re-exporting its own children is not
a cycle. The check is static (``ast``): no module is executed. Two readings:

- module to module (as the shared import-cycle tool reads it): ``from ..a.b import x`` is an
  edge to ``a.b`` (and to ``a.b.x`` when that is a module);
- through packages: importing ``a.b.c`` from outside ``a.b`` first runs ``a/b/__init__.py``, so that
  package (and everything its ``__init__`` imports) is imported too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_fedflat"
#: the round loop's side of the package: no cycle may go through these even when packages are counted
LOOP_PACKAGES = ("hf_fedflat.federation", "hf_fedflat.decentralized", "hf_fedflat.diagnostics", "hf_fedflat.hub",
                 "hf_fedflat.metrics", "hf_fedflat.state", "hf_fedflat.callbacks", "hf_fedflat.plots",
                 "hf_fedflat.cli.comparison")


def module_files() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path], through_packages: bool) -> set[str]:
    """The hf_fedflat modules that importing ``name`` runs directly."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for target in candidates:
            if target not in modules:
                continue
            parts = target.split(".")
            # with packages: those on the way to the target that are not already being imported (ours)
            chain = [".".join(parts[:d]) for d in range(1, len(parts) + 1)] if through_packages else [target]
            for module in chain:
                if module in modules and not (name == module or name.startswith(module + ".")):
                    found.add(module)
    if is_package and not through_packages:  # a package importing its own children: they run inside it
        found = {m for m in found if not m.startswith(name + ".")}
    return found


def import_graph(through_packages: bool = False) -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules, through_packages) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (each holds at least one cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_the_graph_sees_function_local_imports_and_packages():
    graph = import_graph()
    assert "hf_fedflat" in graph and len(graph) > 40
    assert "hf_fedflat.plots" in graph["hf_fedflat.hub.card"]  # imported inside a function
    # the Hub callbacks import the callback base, not the trainer's package
    assert "hf_fedflat.callbacks" in graph["hf_fedflat.hub.push"]
    assert not any(m.startswith("hf_fedflat.federation") for m in import_graph(True)["hf_fedflat.hub.push"])


def test_the_walk_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_through_the_loops_packages():
    found = [c for c in cycles(import_graph(through_packages=True)) if any(m.startswith(LOOP_PACKAGES) for m in c)]
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
