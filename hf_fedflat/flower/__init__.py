"""hf_fedflat on Flower's deployment engine: a SuperLink, one SuperNode per site, data and client state staying on
each node (``pip install "hf_fedflat[flower]"``, Python 3.11 or newer).

- ``hf-fedflat flower-app --config run.yaml --output APP_DIR`` writes a Flower App whose ServerApp and ClientApp
  are hf_fedflat's (:func:`write_flower_app`); ``flwr run APP_DIR <federation>`` runs it;
- ``hf-fedflat flower-local --app APP_DIR --supernodes N`` runs it on a local federation on 127.0.0.1
  (:class:`LocalFederation`);
- in an App of your own: :func:`server_app` / :func:`client_app` are the components, :class:`FedFlatStrategy`
  (``start(grid)``) or :func:`run_server` runs the rounds on a ``Grid`` you hold, :func:`arguments_settings` turns
  ``FedTrainingArguments`` built in Python into the settings both sides take, :class:`FlowerClients` is the
  server's side of the round loop and :func:`train_message` a node's training of one message.

See docs/flower.md.
"""

from __future__ import annotations

import sys

__all__ = ["FedFlatStrategy", "FlowerClients", "LocalFederation", "arguments_settings", "client_app", "require_flower",
           "run_server", "server_app", "train_message", "write_flower_app"]

FLOWER_REQUIREMENT = "flwr>=1.42,<1.43"


def require_flower() -> None:
    """Refuse, in one line, a Python or an environment without Flower."""
    if sys.version_info < (3, 11):
        raise RuntimeError(f"Flower deployments need Python 3.11 or newer (flwr {FLOWER_REQUIREMENT[4:]}); this is "
                           f"Python {sys.version_info.major}.{sys.version_info.minor}.")
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise RuntimeError('Flower is not installed: pip install "hf_fedflat[flower]"') from None


def __getattr__(name: str):
    if name == "client_app":
        from . import relay as module
    elif name == "train_message":
        from . import node as module
    elif name in ("server_app", "run_server", "FedFlatStrategy"):
        from . import server as module
    elif name == "arguments_settings":
        from . import settings as module
    elif name == "FlowerClients":
        from . import server_clients as module
    elif name == "write_flower_app":
        from . import app_folder as module
    elif name == "LocalFederation":
        from . import local as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
