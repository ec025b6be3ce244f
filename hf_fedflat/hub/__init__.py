"""Sharing a federated run: model cards that record the federated set-up, and Hub pushes.

>>> from hf_fedflat.hub import write_model_card_for_trainer, push_final_model, HubPushCallback
>>> trainer = FederatedTrainer(model, args, train, test, callbacks=[HubPushCallback()])

(Each module loads on first use of one of its names.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach, exported_names

_EXPORTS = {
    ".card": (
        "CARD_NAME", "CURVES_IMAGE", "FEDFLAT_SUBFOLDER", "LAYOUTS", "PART_HYPERPARAMETERS", "PARTITION_IMAGE",
        "RUN_CONFIG", "build_model_card", "card_inputs_from_trainer", "detect_layout", "history_metrics",
        "lora_settings", "lower_is_better", "model_card_from_trainer", "plot_metrics", "primary_metric",
        "write_model_card", "write_model_card_for_trainer",
    ),
    ".push": (
        "HubAccessError", "HubPushCallback", "ModelCardCallback", "PushResult", "export_for_hub", "hub_repo_name",
        "planned_pushes", "push_final_model", "timm_architecture",
    ),
}
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
__all__ = exported_names(_EXPORTS)

if TYPE_CHECKING:
    from .card import (
        CARD_NAME,
        CURVES_IMAGE,
        FEDFLAT_SUBFOLDER,
        LAYOUTS,
        PART_HYPERPARAMETERS,
        PARTITION_IMAGE,
        RUN_CONFIG,
        build_model_card,
        card_inputs_from_trainer,
        detect_layout,
        history_metrics,
        lora_settings,
        lower_is_better,
        model_card_from_trainer,
        plot_metrics,
        primary_metric,
        write_model_card,
        write_model_card_for_trainer,
    )
    from .push import (
        HubAccessError,
        HubPushCallback,
        ModelCardCallback,
        PushResult,
        export_for_hub,
        hub_repo_name,
        planned_pushes,
        push_final_model,
        timm_architecture,
    )
