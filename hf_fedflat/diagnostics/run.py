"""Per-run diagnostics (opt-in through ``FedTrainingArguments.diagnostics``), logged into ``history.json``.

- ``train_accuracy``: global model on a fixed training subset; ``train_test_gap`` = train - eval accuracy (FedGAM).
- ``client_accuracy``: global model's accuracy on each client's own data; mean and std over clients
  (FedGH's Acc_l next to Acc_g; computed on the clients' training data, the partition has no local test split).
- ``sharpness``: ``L(w + rho g/||g||) - L(w)`` on the training subset, g its full gradient (FedLESAM Fig. 2).
- ``perturbation_drift``: ``PD = mean_i ||e_i - e_global||`` with ``e_i`` the perturbation client i applies at
  ``w^t`` and ``e_global = rho * gbar/||gbar||``, ``gbar`` the weighted mean of the sampled clients' full local
  gradients at ``w^t`` (one extra pass over each client's data).
- ``gradient_conflict``: share of sampled client pairs whose updates have a negative dot product (FedGH Fig. 2).
- ``loss_surface``: loss of the final model on a grid along two filter-normalised random directions, PNG + JSON.

Always logged: bytes sent down (server to clients) and up per round, and the round / wall time at which
``target_accuracy`` is first reached.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ..aggregators.fedgh import gradient_conflicts
from ..algorithms.base import EPS, ClientUpdate, SharpnessAware
from ..io import atomic_write_json
from ..metrics import correct_predictions, evaluate_model, per_client_accuracy
from .landscape import global_sharpness, loss_and_gradient, loss_surface, plot_loss_surface

DIAGNOSTICS_MESSAGE = "diagnostics"


def tensor_bytes(tensors) -> int:
    """Bytes of a tensor, or of every tensor in nested dicts/lists."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, dict):
        return sum(tensor_bytes(v) for v in tensors.values())
    if isinstance(tensors, (list, tuple)):
        return sum(tensor_bytes(v) for v in tensors)
    return 0


class RunDiagnostics:
    """What a federated run measures besides loss and accuracy.

    It holds the run's settings and data only; every call gets what it measures explicitly: the local
    ``ClientTrainer`` (holding the model), a ``load_weights(params, buffers)`` function, the perturbation.

    Args:
        args: the run's arguments (``diagnostics``, ``diagnostics_num_samples``, ``rho``, ``seed``, ...).
        train_dataset: the full training set (``train_accuracy``, ``sharpness`` and the loss surface use a
            fixed seeded subset of it; ``client_accuracy`` all of it).
        client_indices: each client's rows in ``train_dataset`` (``client_accuracy``).
    """

    def __init__(self, args, train_dataset, client_indices):
        self.args = args
        self.train_dataset = train_dataset
        self.client_indices = client_indices
        self.enabled = set(self.args.diagnostics_list)
        self.reached_target = False
        self._subset = None

    def __contains__(self, name: str) -> bool:
        return name in self.enabled

    @property
    def train_subset(self):
        """A fixed seeded subset of the training set (``diagnostics_num_samples`` rows)."""
        if self._subset is None:
            dataset = self.train_dataset
            n = min(len(dataset), self.args.diagnostics_num_samples)
            rows = np.random.default_rng(self.args.seed).choice(len(dataset), size=n, replace=False)
            self._subset = dataset.select(np.sort(rows))
        return self._subset

    # --- client side ---------------------------------------------------------------------------------
    def client_message(self, client_trainer, perturbation, workspaces: dict, client_dataset) -> dict[str, torch.Tensor]:
        """Run on the process training the client, at ``w^t`` (loaded in ``client_trainer``) before local training."""
        if "perturbation_drift" not in self or not isinstance(perturbation, SharpnessAware):
            return {}
        _, gradient = loss_and_gradient(client_trainer, client_dataset)
        offset = perturbation.drift_offset(workspaces[perturbation.name], gradient.clone())
        if offset is None:
            return {}
        return {"gradient": gradient.cpu(), "offset": offset.cpu()}

    # --- server side ----------------------------------------------------------------------------------
    def round_metrics(self, updates: list[ClientUpdate], weights: torch.Tensor, payload_bytes: int) -> dict[str, Any]:
        record: dict[str, Any] = {
            "bytes_down": payload_bytes * len(updates),
            "bytes_up": sum(tensor_bytes(u.delta) + tensor_bytes({k: v for k, v in u.messages.items()
                                                                  if k != DIAGNOSTICS_MESSAGE}) for u in updates),
        }
        if "gradient_conflict" in self and len(updates) > 1:
            _, conflicts, pairs = gradient_conflicts([u.delta for u in updates])
            record["gradient_conflict_ratio"] = conflicts / pairs
        if "perturbation_drift" in self:
            parts = [u.messages.get(DIAGNOSTICS_MESSAGE) for u in updates]
            if all(parts):
                mean_gradient = sum(float(w) * p["gradient"] for w, p in zip(weights, parts))
                e_global = mean_gradient * (self.args.rho / (mean_gradient.norm() + EPS))
                record["perturbation_drift"] = float(np.mean([(p["offset"] - e_global).norm().item() for p in parts]))
        return record

    def eval_metrics(self, client_trainer, load_weights, params: torch.Tensor, buffers, record: dict) -> dict[str, Any]:
        """Run on the main process at evaluation rounds, after ``record`` has the eval metrics.

        ``load_weights(params, buffers)`` puts the evaluated model into ``client_trainer``."""
        out: dict[str, Any] = {}
        if "train_accuracy" in self:
            load_weights(params, buffers)
            metrics = evaluate_model(client_trainer, self.train_subset)
            out["train_accuracy"] = metrics.get("eval_accuracy")
            out["train_eval_loss"] = metrics.get("eval_loss")
            if out["train_accuracy"] is not None and "eval_accuracy" in record:
                out["train_test_gap"] = out["train_accuracy"] - record["eval_accuracy"]
        if "client_accuracy" in self:
            load_weights(params, buffers)
            prediction = client_trainer.predict(self.train_dataset, metric_key_prefix="clients")
            out.update(per_client_accuracy(correct_predictions(prediction), self.client_indices))
        if "sharpness" in self:
            out.update(global_sharpness(client_trainer, self.train_subset, params.to(client_trainer.space.device),
                                        self.args.rho))
        return out

    def target_metrics(self, record: dict) -> dict[str, Any]:
        """``rounds_to_target`` / ``seconds_to_target`` in the first record whose eval accuracy reaches the target."""
        target = self.args.target_accuracy
        if target is None or self.reached_target or record.get("eval_accuracy", -1.0) < target:
            return {}
        self.reached_target = True
        return {"rounds_to_target": record["round"], "seconds_to_target": record["wall_seconds"]}

    def finish(self, client_trainer, params: torch.Tensor) -> dict[str, str]:
        """End of training: the loss surface of the final model (PNG + JSON in ``output_dir``)."""
        if "loss_surface" not in self:
            return {}
        surface = loss_surface(client_trainer, self.train_subset, params.to(client_trainer.space.device),
                               resolution=self.args.loss_surface_resolution, seed=self.args.seed)
        out_dir = self.args.output_dir
        json_path = os.path.join(out_dir, "loss_surface.json")
        atomic_write_json(surface, json_path)
        png = plot_loss_surface(surface, os.path.join(out_dir, "loss_surface.png"),
                                title=f"{self.args.fed_algorithm}: loss surface of the final model")
        return {"json": json_path, "png": png}
