"""What a finished run leaves on disk, written without training (``write_run``), and the inputs of its model card:
the run's arguments with a sentinel token that must never be written anywhere, its algorithm, a 30-round
history and a 4-client partition."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hf_fedflat.data import ClientPartition

SENTINEL = "hf_SENTINELtoken0123456789"


def make_history(rounds: int) -> list[dict]:
    accuracy = [0.2 + 0.6 * (1 - np.exp(-r / 6)) for r in range(1, rounds + 1)]
    accuracy[17] = 0.95  # a best round off the stride
    return [{"round": r, "num_clients": 5, "clients": [0, 1], "learning_rate": 0.05, "train_loss": 2.0 / r,
             "local_steps": 4.0, "eval_loss": 2.1 / r, "eval_accuracy": accuracy[r - 1], "round_seconds": 0.25,
             "wall_seconds": 0.25 * r} for r in range(1, rounds + 1)]


def make_partition() -> ClientPartition:
    counts = np.array([[5, 0, 1], [0, 4, 4], [2, 2, 0], [3, 1, 6]])
    starts = np.concatenate([[0], np.cumsum(counts.sum(1))])
    return ClientPartition(client_indices=[np.arange(a, b) for a, b in zip(starts[:-1], starts[1:])], label_counts=counts,
                           scheme="dirichlet", alpha=0.3, seed=42, class_names=["a", "b", "c"], num_rows=int(starts[-1]))


ARGS = dict(fed_algorithm="fedsam", rho=0.1, num_clients=20, clients_per_round=5, num_rounds=30, local_epochs=1.0,
            learning_rate=0.05, lr_decay_per_round=0.998, optim="sgd", per_device_train_batch_size=16, max_grad_norm=10.0,
            seed=42, partition_scheme="dirichlet", dirichlet_alpha=0.3, server_learning_rate=1.0,
            aggregation_weights="samples", hub_token=SENTINEL)
ALGORITHM = {"name": "fedsam", "perturbation": "sam", "corrections": [], "aggregator": "mean", "passes_per_step": 2}


def write_run(output_dir: Path, model) -> Path:
    """What a finished run leaves on disk (without training): final_model/, history.json, partition.json."""
    final = output_dir / "final_model"
    model.save_pretrained(final)
    (final / "federated_config.json").write_text(json.dumps({"algorithm": ALGORITHM, "num_clients": 20}))
    (output_dir / "history.json").write_text(json.dumps(make_history(30)))
    make_partition().save_json(output_dir / "partition.json")
    return final
