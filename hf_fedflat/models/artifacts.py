"""The final model folder as a standard artifact: what ``from_pretrained`` and ``timm`` need, without hf_fedflat.

:func:`complete_model_folder` runs after the weights are saved (``FederatedTrainer.save_model``):

* the tokenizer / image processor the run used (the Trainer's ``processing_class``) is saved next to the
  weights, so ``AutoTokenizer.from_pretrained(final_model)`` returns the trained vocabulary and
  ``pipeline(task, final_model)`` works;
* a :class:`~hf_fedflat.models.FedFlatImageClassifier` around a timm architecture is laid out the timm way
  (:func:`write_timm_layout`): ``config.json`` (``architecture``, ``num_classes``, ``label_names``,
  ``pretrained_cfg``, ``model_args``) and ``model.safetensors`` with timm's keys at the root -- loaded by
  ``timm.create_model("local-dir:<folder>", pretrained=True)`` and by transformers' ``TimmWrapper``
  (``AutoModelForImageClassification.from_pretrained(<folder>)``), neither importing hf_fedflat -- and
  hf_fedflat's own ``save_pretrained`` files in ``hf_fedflat/`` (:func:`hf_fedflat.models.load_model` reads
  them from either place).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .factory import FEDFLAT_SUBFOLDER, load_model

__all__ = ["FEDFLAT_SUBFOLDER", "complete_model_folder", "timm_architecture", "write_timm_layout"]


def timm_architecture(model_dir: str | os.PathLike) -> str | None:
    """The timm model name behind an hf_fedflat model folder, when timm can rebuild it alone.

    ``None`` for folders that are not ``FedFlatImageClassifier`` saves, and for the architectures
    hf_fedflat builds itself (``small_cnn``, ``resnet18_gn``, ``fedgam_cnn``).
    """
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    if data.get("model_type") != "hf_fedflat_classifier":
        return None
    import timm

    from .backbones import CUSTOM_MODELS

    name = data.get("architecture")
    if not name or name in CUSTOM_MODELS or not timm.is_model(name):
        return None
    return name


def write_timm_layout(
    model_dir: str | os.PathLike,
    export_dir: str | os.PathLike,
    *,
    data_config: Mapping[str, Any] | None = None,
) -> None:
    """Write timm's folder format for the hf_fedflat model saved in ``model_dir`` into ``export_dir``.

    ``config.json`` holds ``architecture``, ``num_classes``, ``num_features``, ``label_names`` (from the
    model's ``id2label``), ``pretrained_cfg`` (timm's for the architecture, with ``data_config``'s ``mean``/
    ``std``/... and the run's ``input_size``) and ``model_args`` (the architecture options, ``in_chans`` and
    ``img_size`` for ViT-like models; not ``num_classes``, which transformers' ``TimmWrapper`` passes itself).
    ``model.safetensors`` holds the backbone's weights under timm's names.
    """
    from timm.models import save_for_hf

    model = load_model(model_dir)
    config = model.config
    backbone = model.backbone
    model_args = dict(config.model_kwargs or {})
    model_args["in_chans"] = int(config.in_chans)
    if hasattr(backbone, "patch_embed"):  # ViT-like: the resolution is part of the architecture
        model_args["img_size"] = int(config.image_size)
    data_config = dict(data_config or {})
    data_config.setdefault("input_size", (int(config.in_chans), int(config.image_size), int(config.image_size)))
    labels = [str(config.id2label[i]) for i in range(config.num_labels)] if config.id2label else None
    model_config = {"label_names": labels} if labels else None
    os.makedirs(export_dir, exist_ok=True)
    save_for_hf(backbone, os.fspath(export_dir), model_config=model_config, model_args=model_args,
                safe_serialization=True, data_config=data_config)
    path = Path(export_dir) / "config.json"
    data = json.loads(path.read_text())
    # transformers' TimmWrapper passes num_classes itself and fails on a second one in model_args;
    # timm takes the head size from the root `num_classes`.
    data.get("model_args", {}).pop("num_classes", None)
    data.get("pretrained_cfg", {})["input_size"] = list(data_config["input_size"])
    path.write_text(json.dumps(data, indent=2))


def complete_model_folder(
    directory: str | os.PathLike,
    *,
    processing_class: Any = None,
    data_config: Mapping[str, Any] | None = None,
    timm_layout: bool = True,
) -> str:
    """Make a folder holding freshly saved weights loadable the standard ways (see the module docstring).

    Args:
        directory: the folder ``save_pretrained`` (or :func:`~hf_fedflat.models.lora.save_federated_model`)
            just wrote.
        processing_class: the tokenizer / image processor / feature extractor to save beside the weights
            (anything with ``save_pretrained``); None: nothing to save.
        data_config: preprocessing recorded in timm's ``pretrained_cfg`` (``mean``, ``std``, ...).
        timm_layout: lay out a timm-architecture ``FedFlatImageClassifier`` as timm's format at the root.

    Returns:
        The layout written: ``"timm"``, ``"peft"`` or ``"hf_fedflat"`` (``hf_fedflat.hub.card.LAYOUTS``).
    """
    directory = Path(directory)
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(os.fspath(directory))
    if (directory / "adapter_config.json").is_file():
        return "peft"
    if not timm_layout or timm_architecture(directory) is None:
        return "hf_fedflat"
    sub = directory / FEDFLAT_SUBFOLDER
    sub.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        os.replace(directory / name, sub / name)
    try:
        write_timm_layout(sub, directory, data_config=data_config)
    except BaseException:
        for name in ("config.json", "model.safetensors"):
            if (sub / name).is_file():
                os.replace(sub / name, directory / name)
        shutil.rmtree(sub, ignore_errors=True)
        raise
    return "timm"
