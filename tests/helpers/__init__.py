"""Helpers shared by the tests (``tests/`` is on ``sys.path``: ``from helpers import REPO_ROOT``).

* :data:`REPO_ROOT` -- the repository, for files a test reads by path (``recipes/``, ``sweeps/``,
  ``benchmarks/``, the package itself) whatever folder the test sits in;
* :data:`TEST_SCRIPTS` -- ``tests/scripts``: small runs started in a subprocess;
* :func:`load_recipe` -- a script of ``recipes/`` as a module (its ``main``, ``DEFAULTS``, ``SMOKE``);
* :func:`load_benchmark` -- a script of ``benchmarks/`` as a module;
* :func:`forbid_loading` -- data loading and model building fail the test if reached (configuration checks);
* :func:`help_text` -- what a command's ``--help`` prints (it must exit with status 0).

The submodules hold what several test files share: :mod:`.runs` (a tiny federated run), :mod:`.hf_fixtures`
(tiny transformers models), :mod:`.hub` (a finished run on disk), :mod:`.images`, :mod:`.leaf`, :mod:`.random_draws`
(a dropout model and noisy data: runs whose weights depend on every random draw).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_SCRIPTS = REPO_ROOT / "tests" / "scripts"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as the module ``benchmarks_<name>``, with ``benchmarks/`` on ``sys.path`` (the
    scripts import each other); the caller removes it from ``sys.modules`` when done."""
    path = REPO_ROOT / "benchmarks" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_recipe(name: str):
    """``recipes/<name>.py`` imported as the module ``recipe_<name>``."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", REPO_ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def forbid_loading(monkeypatch) -> None:
    """Data loading and model building (``hf_fedflat.cli.experiment``'s ``load_data`` and ``build_model``) fail
    the test if reached: what checks a configuration must be done before either."""
    import hf_fedflat.cli.experiment as experiment_module

    def loaded(*args, **kwargs):
        raise AssertionError("data or model loaded before the configuration was checked")

    monkeypatch.setattr(experiment_module, "load_data", loaded)
    monkeypatch.setattr(experiment_module, "build_model", loaded)


def help_text(call, capsys) -> str:
    """The standard output of ``call()``, a command given ``--help``: it must exit with status 0."""
    import pytest

    with pytest.raises(SystemExit) as exit_:
        call()
    assert exit_.value.code == 0
    return capsys.readouterr().out
