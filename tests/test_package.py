"""The package as a whole: no import cycles between hf_fedflat's modules, and ``import hf_fedflat`` is lazy.

Import cycles: every ``import`` / ``from ... import`` statement of every module (at any depth of the file, so an
import hidden inside a function counts) is an edge; a package's ``__init__`` re-exporting its own children is not
a cycle. The check is static (``ast``): no module is executed. Two readings:

- module to module (as an import-cycle checker reads it): ``from ..a.b import x`` is an
  edge to ``a.b`` (and to ``a.b.x`` when that is a module);
- through packages: importing ``a.b.c`` from outside ``a.b`` first runs ``a/b/__init__.py``, so that
  package (and everything its ``__init__`` imports) is imported too.

Lazy imports (``hf_fedflat._lazy``): ``import hf_fedflat`` registers every preset and loads neither the trainer nor
the heavy stack; each package's lazy names agree with the imports it shows type checkers and the import-cycle
check above.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import hf_fedflat

from helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "hf_fedflat"
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


# --- lazy imports ---------------------------------------------------------------------------------------------
#: the package ``import hf_fedflat`` loads (the lazy names are read from its files)
IMPORTED = Path(hf_fedflat.__file__).resolve().parent
#: loaded on first use only (the cost ``import hf_fedflat`` must not pay)
HEAVY = ("transformers.trainer", "transformers.training_args", "datasets", "timm", "peft", "accelerate",
         "matplotlib", "scipy", "hf_fedflat.federation.trainer", "hf_fedflat.config", "hf_fedflat.data.partition")


def run_python(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_hf_fedflat_loads_no_heavy_module_and_registers_every_preset():
    found = run_python(
        "import json, sys, hf_fedflat\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "from hf_fedflat.algorithms import PRESETS\n"
        "print(json.dumps({'heavy': heavy, 'presets': sorted(PRESETS)}))"
    )
    assert found["heavy"] == []
    assert {"fedavg", "fedsam", "scaffold", "dfedavg", "dfedgam"} <= set(found["presets"])


def test_names_load_on_first_use():
    found = run_python(
        "import json, sys\n"
        "from hf_fedflat import FederatedTrainer, FedTrainingArguments, init_process_group, create_trainer\n"
        "from hf_fedflat.federation.comm import init_federated_process_group\n"
        "import hf_fedflat.federation as federation\n"
        "print(json.dumps({'trainer': FederatedTrainer.__module__, 'args': FedTrainingArguments.__module__,\n"
        "  'alias': init_process_group is init_federated_process_group,\n"
        "  'same': federation.FederatedTrainer is FederatedTrainer, 'loaded': 'transformers.trainer' in sys.modules}))"
    )
    assert found == {"trainer": "hf_fedflat.federation.trainer", "args": "hf_fedflat.config", "alias": True,
                     "same": True, "loaded": True}


def lazy_packages() -> dict[str, Path]:
    return {str(p.parent.relative_to(IMPORTED.parent)).replace("/", "."): p for p in IMPORTED.rglob("__init__.py")
            if "_EXPORTS" in p.read_text()}


def test_lazy_exports_match_the_type_checking_imports():
    packages = lazy_packages()
    assert {"hf_fedflat", "hf_fedflat.federation", "hf_fedflat.decentralized", "hf_fedflat.data",
            "hf_fedflat.hub", "hf_fedflat.training", "hf_fedflat.diagnostics"} <= set(packages)
    for name, path in packages.items():
        tree = ast.parse(path.read_text())
        exports = next(ast.literal_eval(node.value) for node in tree.body
                       if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_EXPORTS")
        lazy = {(module, entry.partition(" as ")[0], entry.partition(" as ")[2] or entry)
                for module, names in exports.items() for entry in names}
        checking = next(node for node in tree.body
                        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
        shown = {("." * node.level + (node.module or ""), alias.name, alias.asname or alias.name)
                 for node in checking.body for alias in node.names}
        assert lazy == shown, name
        module = __import__(name, fromlist=["_"])
        for _, _, public in lazy:  # every lazy name resolves
            assert getattr(module, public) is not None, (name, public)
