"""Final weights of every preset (and the combinations the redesign must keep) over 3 rounds.

Recorded once before the 2026-11 redesign (``python tests/golden/record_weights.py``) into
``weights_before_redesign.json``; ``tests/golden/test_golden_weights.py`` recomputes them and compares the
SHA-256 of the float32 bytes: any change of the arithmetic of a step, correction or server rule shows.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from conftest import TinyClassifier, make_tiny_dataset  # noqa: E402

from hf_fedflat import FedTrainingArguments, create_trainer, list_algorithms  # noqa: E402

TRAIN = make_tiny_dataset(n=96, seed=1)
TEST = make_tiny_dataset(n=30, seed=2)
HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "weights_before_redesign.json")

#: run name -> overrides of the base settings; every preset, plus paths the fast machinery treats apart
EXTRA_RUNS = {
    "fedlesam_s+fedgh": {"fed_algorithm": "fedlesam_s+fedgh"},
    "feddyn+fedgh": {"fed_algorithm": "feddyn+fedgh"},
    "fedadam+fedgh": {"fed_algorithm": "fedadam+fedgh"},
    "fednova+fedgh": {"fed_algorithm": "fednova+fedgh"},
    "fedsmoo+fedgh": {"fed_algorithm": "fedsmoo+fedgh"},
    "gam_original": {"fed_algorithm": "fedavg", "perturbation": "gam_original"},
    "all_corrections_lesam": {"fed_algorithm": "fedlesam", "corrections": "prox,scaffold,feddyn,fedup,momentum"},
    "all_corrections_sam": {"fed_algorithm": "fedsam", "corrections": "prox,scaffold,fedup,momentum"},
    "fedlesam_last_global_update": {"fed_algorithm": "fedlesam", "lesam_direction": "last_global_update"},
    "scaffold_accumulation": {"fed_algorithm": "scaffold", "gradient_accumulation_steps": 2},
    "fedprox_accumulation": {"fed_algorithm": "fedprox", "gradient_accumulation_steps": 2},
    "fedsam_accumulation": {"fed_algorithm": "fedsam", "gradient_accumulation_steps": 2},
    "fedup_clipped": {"fed_algorithm": "fedup", "max_grad_norm": 0.05},
    "fedavg_uniform_epochs": {"fed_algorithm": "fedavg", "aggregation_weights": "uniform", "local_steps": None,
                              "local_epochs": 1.0},
}


def base_settings(output_dir: str) -> dict:
    return dict(
        output_dir=output_dir, use_cpu=True, num_clients=6, clients_per_round=3, num_rounds=3, local_steps=3,
        per_device_train_batch_size=4, partition_scheme="dirichlet", dirichlet_alpha=0.5, min_partition_size=4,
        learning_rate=0.1, lr_decay_per_round=0.9, seed=7, disable_tqdm=True,
    )


def runs() -> dict[str, dict]:
    out = {name: {"fed_algorithm": name} for name in list_algorithms()}
    out.update(EXTRA_RUNS)
    return out


def final_weights(overrides: dict) -> torch.Tensor:
    with tempfile.TemporaryDirectory() as tmp:
        settings = base_settings(tmp)
        settings.update(overrides)
        args = FedTrainingArguments(**settings)
        torch.manual_seed(0)
        trainer = create_trainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
        return trainer.train().params.detach().to(torch.float32).contiguous()


def digest(params: torch.Tensor) -> str:
    return hashlib.sha256(params.numpy().tobytes()).hexdigest()


def entry(params: torch.Tensor) -> dict:
    return {"sha256": digest(params), "norm": float(params.double().norm()), "first": params[:4].tolist()}


if __name__ == "__main__":
    # python tests/golden/record_weights.py                 every entry (only before the redesign)
    # python tests/golden/record_weights.py NAME [NAME ...] re-record these entries only, every other one kept as it
    #     is: for a behaviour changed on purpose, listed with its reason in CHANGED_ENTRIES.md
    only = sys.argv[1:]
    unknown = sorted(set(only) - set(runs()))
    if unknown:
        raise SystemExit(f"not a recorded run: {unknown}")
    record = {}
    if only:
        with open(RECORD) as handle:
            record = json.load(handle)
    for name, overrides in runs().items():
        if only and name not in only:
            continue
        record[name] = entry(final_weights(overrides))
        print(name, record[name]["sha256"][:16], record[name]["norm"])
    with open(RECORD, "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
