"""Sharing a federated run: model cards that record the federated set-up, and Hub pushes.

>>> from hf_fedflat.hub import write_model_card_for_trainer, push_final_model, HubPushCallback
>>> trainer = FederatedTrainer(model, args, train, test, callbacks=[HubPushCallback()])
"""

from .card import (
    CARD_NAME,
    CURVES_IMAGE,
    FEDFLAT_SUBFOLDER,
    LAYOUTS,
    PART_HYPERPARAMETERS,
    PARTITION_IMAGE,
    build_model_card,
    card_inputs_from_trainer,
    detect_layout,
    model_card_from_trainer,
    write_model_card,
    write_model_card_for_trainer,
)
from .push import (
    HubPushCallback,
    ModelCardCallback,
    PushResult,
    export_for_hub,
    hub_repo_name,
    planned_pushes,
    push_final_model,
    timm_architecture,
)

__all__ = [
    "CARD_NAME", "CURVES_IMAGE", "FEDFLAT_SUBFOLDER", "LAYOUTS", "PARTITION_IMAGE", "PART_HYPERPARAMETERS",
    "HubPushCallback", "ModelCardCallback", "PushResult", "build_model_card", "card_inputs_from_trainer",
    "detect_layout",
    "export_for_hub", "hub_repo_name", "model_card_from_trainer", "planned_pushes", "push_final_model",
    "timm_architecture", "write_model_card", "write_model_card_for_trainer",
]
