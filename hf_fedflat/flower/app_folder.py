"""``hf-fedflat flower-app``: a ready Flower App from a run's configuration.

The App folder holds a ``pyproject.toml`` whose ``[tool.flwr.app.components]`` are hf_fedflat's ServerApp and
ClientApp (through a short module of the App's own package) and whose ``[tool.flwr.app.config]`` is the run's
configuration (:mod:`.settings`), plus the deployment's own settings (how long the server waits for replies and for
nodes to connect). Relative paths of the configuration are made absolute (relative to the folder ``flower-app`` runs
in, as ``hf-fedflat train`` reads them), so that the apps, which run in the SuperLink's and SuperNodes' working
folders, read the same files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..io import atomic_write_text
from .settings import ALWAYS_PRESENT, DEPLOYMENT_DEFAULTS, app_settings

__all__ = ["toml_value", "write_flower_app"]

_APPS_MODULE = '''"""The Flower App's components: hf_fedflat's ServerApp and ClientApp (hf_fedflat.flower).

Flower starts a ClientApp process for every message: the ClientApp (hf_fedflat/flower/relay.py) is loaded by its file,
without importing the hf_fedflat package (and torch) there; the ServerApp imports hf_fedflat when it starts.
"""

import importlib.util
import os

from flwr.serverapp import ServerApp

_spec = importlib.util.spec_from_file_location("hf_fedflat_flower_relay", os.path.join(
    importlib.util.find_spec("hf_fedflat").submodule_search_locations[0], "flower", "relay.py"))
_relay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_relay)

client = _relay.client_app()
server = ServerApp()


@server.main()
def main(grid, context):
    from hf_fedflat.flower.server import serve

    serve(grid, context)
'''
#: settings that name files or folders, made absolute when they are relative paths that exist
_PATH_FIELDS = ("output_dir", "data_dir", "dataset_name", "model_name_or_path", "pretrained_path", "client_state_dir",
                "logging_dir", "generation_prompts_file", "smoke_dir", "resume_from_checkpoint")


def toml_value(value: Any) -> str:
    """``value`` as a TOML value (the App's settings; ``flwr run --run-config``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_flower_app(config: dict[str, Any], output: str | os.PathLike, *, name: str | None = None,
                     base_dir: str | os.PathLike = ".") -> Path:
    """Write the Flower App of ``config`` (a run's ``field: value`` mapping, as a ``--config`` file holds) into
    ``output``; returns the folder. ``base_dir``: what relative paths in ``config`` are relative to."""

    output = Path(output)
    name = name or re.sub(r"[^a-z0-9]+", "-", output.resolve().name.lower()).strip("-") or "hf-fedflat-app"
    package = name.replace("-", "_")
    if not package[0].isalpha():
        package = "app_" + package
    values = dict(config)
    values.setdefault("output_dir", os.path.join("outputs", package))
    for key in _PATH_FIELDS:
        value = values.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            candidate = os.path.join(base_dir, os.path.expanduser(value))
            if key == "output_dir" or os.path.exists(candidate):
                values[key] = os.path.abspath(candidate)
    for key, default in ALWAYS_PRESENT.items():
        if key not in values:
            values[key] = default
    settings = {**app_settings(values), **{k: values.get(k, v) for k, v in DEPLOYMENT_DEFAULTS.items()}}
    config_lines = "\n".join(f"{key} = {toml_value(value)}" for key, value in settings.items()
                             if value is not None)
    pyproject = f'''# A Flower App written by `hf-fedflat flower-app`: hf_fedflat's ServerApp and ClientApp with this run's settings.
# Run it: flwr run . <federation> [--run-config "num_rounds=50 resume_from_checkpoint='latest'"]
# Every machine of the federation (SuperLink and SuperNodes) needs: pip install "hf_fedflat[flower]"
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "hf_fedflat federated run ({values.get('fed_algorithm', 'fedavg')}) as a Flower App"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["{package}"]

[tool.flwr.app]
publisher = "hf-fedflat"

[tool.flwr.app.components]
serverapp = "{package}.apps:server"
clientapp = "{package}.apps:client"

[tool.flwr.app.config]
{config_lines}
'''
    (output / package).mkdir(parents=True, exist_ok=True)
    atomic_write_text(pyproject, output / "pyproject.toml")
    atomic_write_text("", output / package / "__init__.py")
    atomic_write_text(_APPS_MODULE, output / package / "apps.py")
    return output
