"""``import hf_fedflat`` is lazy: it registers every preset and loads neither the trainer nor the heavy stack;
each package's lazy names agree with the imports it shows type checkers and the import-cycle check."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import hf_fedflat

PACKAGE = Path(hf_fedflat.__file__).resolve().parent
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
    return {str(p.parent.relative_to(PACKAGE.parent)).replace("/", "."): p for p in PACKAGE.rglob("__init__.py")
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
