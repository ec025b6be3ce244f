"""Where a model given by ``--model_name_or_path`` came from on the Hub, when a local folder records it.

Two uses, with two standards of proof:

* **the weights to load** (``base_model_name_or_path`` of a saved adapter): only an *exact* origin, the same bytes
  on the Hub: a Hub id given as such, or a folder inside the Hub cache
  (``.../models--<org>--<name>/snapshots/<commit>/``, where ``from_pretrained`` and ``snapshot_download`` put
  downloads), which names the repository and the commit. Anything else is recorded as an absolute path: a local
  folder may hold weights trained since they were downloaded.
* **the model card's ``base_model``** (the Hub's model tree, a Hub id and never a path): the exact origin, else what
  the folder says it was made from: ``_name_or_path`` in its ``config.json`` (transformers 4.x wrote the name the
  model was loaded by there; 5.x no longer does), or the ``base_model`` of its own model card (``README.md``, as
  ``Trainer.create_model_card`` and hf_fedflat write it).

A folder downloaded with ``hf download --local-dir`` keeps only the commit and the file hashes
(``.cache/huggingface/download/*.metadata``), not the repository's name, so it has no origin here unless its config
or card names one.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ModelOrigin", "base_model_reference", "is_hub_id", "model_origin"]

# owner/name (or a bare legacy name such as "gpt2"): letters, digits, "-", "_", "."; no leading "." or "/"
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.\-]{0,95}/)?[A-Za-z0-9][\w.\-]{0,95}$")
_CACHE_FOLDER = re.compile(r"^models--(?P<repo>.+)$")


def is_hub_id(text: object) -> bool:
    """Whether ``text`` has the form of a Hub model id (``owner/name`` or a legacy bare name) and is no local path."""
    return (isinstance(text, str) and bool(_HUB_ID.match(text)) and not text.endswith((".", "-"))
            and ".." not in text and not os.path.exists(text))


@dataclass(frozen=True)
class ModelOrigin:
    """A model's Hub origin: ``hub_id`` (None: unknown), the ``revision`` (commit) when known, and whether the
    weights are exactly that repository's (``exact``) or only made from it."""

    hub_id: str | None = None
    revision: str | None = None
    exact: bool = False


def _from_cache_layout(folder: Path) -> ModelOrigin | None:
    """``.../models--org--name/snapshots/<commit>`` (the Hub cache) -> ``org/name`` at ``<commit>``."""
    parts = folder.absolute().parts
    for i in range(1, len(parts) - 1):
        match = _CACHE_FOLDER.match(parts[i - 1]) if parts[i] == "snapshots" else None
        if match:
            hub_id = match.group("repo").replace("--", "/")
            return ModelOrigin(hub_id, parts[i + 1], exact=True) if is_hub_id(hub_id) else None
    return None


def _recorded_name(folder: Path) -> str | None:
    """``_name_or_path`` of ``config.json``, else the first ``base_model`` of ``README.md``'s metadata."""
    config = folder / "config.json"
    if config.is_file():
        try:
            name = json.loads(config.read_text()).get("_name_or_path")
        except (OSError, ValueError, AttributeError):
            name = None
        if is_hub_id(name):
            return name
    card = folder / "README.md"
    if card.is_file():
        try:
            from huggingface_hub import ModelCard

            base = ModelCard.load(card).data.to_dict().get("base_model")
        except Exception:  # a README that is no model card: no origin from it
            base = None
        base = base[0] if isinstance(base, list) and base else base
        if is_hub_id(base):
            return base
    return None


def model_origin(name_or_path: str | os.PathLike | None) -> ModelOrigin:
    """The Hub origin of what ``--model_name_or_path`` named (see the module docstring).

    >>> model_origin("openai-community/gpt2")                 # not a local path: a Hub id
    ModelOrigin(hub_id='openai-community/gpt2', revision=None, exact=True)
    """
    if name_or_path is None:
        return ModelOrigin()
    text = os.fspath(name_or_path)
    if not os.path.exists(text):
        return ModelOrigin(text, None, exact=True) if is_hub_id(text) else ModelOrigin()
    folder = Path(text).expanduser()
    cached = _from_cache_layout(folder)
    if cached is not None:
        return cached
    recorded = _recorded_name(folder)
    return ModelOrigin(recorded, None, exact=False) if recorded else ModelOrigin()


def base_model_reference(name_or_path: str | os.PathLike) -> tuple[str, str | None]:
    """``(what an adapter's base_model_name_or_path should say, its revision)``: the Hub id and commit of an exact
    origin, else the absolute path of the local folder (so the adapter loads from any working directory)."""
    origin = model_origin(name_or_path)
    if origin.exact and origin.hub_id:
        return origin.hub_id, origin.revision
    return os.path.abspath(os.path.expanduser(os.fspath(name_or_path))), None
