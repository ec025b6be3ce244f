"""Lazy package attributes (PEP 562): ``import hf_fedflat`` costs about ``import torch``, not the whole stack.

A package lists what it re-exports and from which of its modules; the module is imported on first access
of one of its names (``from hf_fedflat.federation import FederatedTrainer`` and ``hf_fedflat.federation.X``
both work, as before). Each package repeats the same imports under ``if TYPE_CHECKING:`` so that type
checkers, IDEs and the static import-cycle check (``tests/test_package.py``) see the real edges; the same test
file checks that the two lists agree.

This module imports nothing of hf_fedflat.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def attach(package: str, exports: Mapping[str, Iterable[str]], namespace: dict[str, Any]
           ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose names come from ``exports`` (module -> names).

    A module is relative to ``package`` when it starts with a dot; a name ``"x as y"`` exports the module's
    ``x`` as ``y``. A name is imported once, then stored in the package's ``namespace`` (later lookups are
    plain attribute reads).
    """
    where = {}
    for module, names in exports.items():
        for entry in names:
            source, _, public = entry.partition(" as ")
            where[public or source] = (module, source)

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, source = where[name]
        value = getattr(importlib.import_module(module, package), source)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__


def exported_names(exports: Mapping[str, Iterable[str]]) -> list[str]:
    """Every name of ``exports`` (for ``__all__``)."""
    return sorted({entry.partition(" as ")[2] or entry for names in exports.values() for entry in names})
