"""Piece files are plain torch: the algorithm package and the piece files import no runtime machinery, and a piece
file imports only torch, the standard library and ``hf_fedflat.algorithms.base``."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

from helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "hf_fedflat"

PIECE_FILES = sorted(
    p for package in ("algorithms", "perturbations", "corrections", "aggregators") for p in (PACKAGE / package).glob("*.py")
)
FORBIDDEN = ("hf_fedflat.vectors", "hf_fedflat.runtime", "hf_fedflat.training", "hf_fedflat.federation",
             "hf_fedflat.state", "transformers", "accelerate", "ctypes")


def imported_modules(path: pathlib.Path) -> set[str]:
    """Absolute names of every module a file imports (relative imports resolved; ``from x import y`` gives x.y too)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", PIECE_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_piece_files_import_no_runtime_machinery(path):
    bad = sorted(name for name in imported_modules(path) if name.startswith(FORBIDDEN))
    assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}: piece files are plain torch"


def test_the_import_scan_sees_relative_imports():
    sample = PACKAGE / "training" / "step.py"  # machinery: it does import the runtime
    assert any(name.startswith("hf_fedflat.runtime") for name in imported_modules(sample))


PIECE_PACKAGES = ("perturbations", "corrections", "aggregators")
PIECE_MODULES = sorted(p for package in PIECE_PACKAGES for p in (PACKAGE / package).glob("*.py"))
ALGORITHM_BASE = "hf_fedflat.algorithms.base"


def imports_of(path: pathlib.Path) -> list[str]:
    """The module each import statement of a file names (relative ones resolved), one entry per statement."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append(base)
    return found


@pytest.mark.parametrize("path", PIECE_MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_piece_files_import_only_torch_the_standard_library_and_the_algorithm_base(path):
    """A piece file reads as its formula: everything of this package it needs comes from ``algorithms.base``. A
    package's ``__init__`` may also import its own modules (it registers them)."""
    own_package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
    bad = []
    for name in imports_of(path):
        top = name.split(".")[0]
        allowed = (name == ALGORITHM_BASE or top == "torch" or top == "__future__" or top in sys.stdlib_module_names
                   or (path.name == "__init__.py" and name.startswith(own_package + ".")))
        if not allowed:
            bad.append(name)
    assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}: import it from hf_fedflat.algorithms.base"


def test_the_piece_import_scan_sees_what_it_forbids():
    assert "hf_fedflat.training.step" not in imports_of(PACKAGE / "training" / "client_trainer.py")
    assert "hf_fedflat.runtime.finite_fallback" not in imports_of(PACKAGE / "training" / "step.py")  # (a package)
    assert "hf_fedflat.runtime" in imports_of(PACKAGE / "training" / "step.py")
    assert "numpy" in imports_of(PACKAGE / "algorithms" / "topology.py")
