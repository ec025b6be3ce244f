"""Every preset for 2 rounds in bf16 (issue 20's correctness item for the GPU, run here on the CPU's bf16 autocast):
the Trainer's autocast is on, the weights stay finite, and each preset's 2-round update stays near its fp32 one.

``HF_FEDFLAT_TEST_CUDA=1 pytest tests/test_bf16_presets.py`` runs the same on the GPU (where one is)."""

from __future__ import annotations

import os

import pytest
import torch

from hf_fedflat import FedTrainingArguments, ParameterSpace, create_trainer, list_algorithms

from conftest import TinyClassifier
from test_federated_run import TEST, TRAIN


ON_CUDA = os.environ.get("HF_FEDFLAT_TEST_CUDA") == "1" and torch.cuda.is_available()


def two_rounds(tmp_path, algorithm: str, bf16: bool):
    args = FedTrainingArguments(
        output_dir=str(tmp_path), use_cpu=not ON_CUDA, bf16=bf16, fed_algorithm=algorithm, num_clients=4,
        clients_per_round=2, num_rounds=2, local_steps=2, per_device_train_batch_size=4, partition_scheme="iid",
        learning_rate=0.1, seed=7, disable_tqdm=True, report_to="none")
    torch.manual_seed(0)
    model = TinyClassifier()
    initial = ParameterSpace(model).flatten()  # (a copy)
    trainer = create_trainer(model, args, TRAIN, TEST, label_column="labels")  # (the gossip presets too)
    output = trainer.train()
    return trainer, output.params - initial


@pytest.mark.parametrize("algorithm", sorted(list_algorithms()))
def test_every_preset_runs_two_rounds_in_bf16_near_its_fp32_run(tmp_path, algorithm):
    trainer, update = two_rounds(tmp_path / "bf16", algorithm, bf16=True)
    # (read before the fp32 run: accelerate's state is shared by every Accelerator of the process)
    assert trainer.client_trainer.accelerator.mixed_precision == "bf16"
    _, reference = two_rounds(tmp_path / "fp32", algorithm, bf16=False)
    assert torch.isfinite(update).all() and update.abs().max() > 0
    assert not torch.equal(update, reference)  # the forward did run in bf16 ...
    relative = float((update - reference).norm() / reference.norm())
    # ... and 2 rounds of it stay near fp32: measured 1.2e-3 to 3.0e-3 over the 28 presets (bf16 keeps ~3 significant
    # digits); a step taken in the wrong dtype or a correction scaled twice lands far outside
    assert relative < 0.02, relative
