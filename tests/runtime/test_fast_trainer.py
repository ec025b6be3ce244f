"""The reused local Trainer (``runtime.fast_trainer``, the fast path) gives the plain Trainer path's numbers: one
optimizer and scratch vectors for every client, per-client seeding, workspace views split once per client."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import set_seed

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer, runtime
from hf_fedflat.training import ParameterSpace

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN


class Trace(FederatedCallback):
    """Which optimizer object each client trained with (kept alive, so that ids are not reused)."""

    def __init__(self):
        self.optimizers = []

    def on_client_end(self, trainer, round_index, update, **kwargs):
        self.optimizers.append(trainer.client_trainer.optimizer)


def run(output_dir, *, reuse: bool, **overrides):
    """A federated run with the fast path on (``reuse``) or off (the plain Trainer path)."""
    settings = dict(
        output_dir=str(output_dir), use_cpu=True, num_clients=6, clients_per_round=3, num_rounds=4,
        per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1, lr_decay_per_round=0.9, seed=7,
    )
    settings.update(overrides)
    args = FedTrainingArguments(**settings)
    torch.manual_seed(0)
    trace = Trace()
    with runtime.fast_path(reuse):
        trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels", callbacks=[trace])
        return trainer, trainer.train(), trace


@pytest.mark.parametrize("algorithm, overrides", [
    # AdamW has per-parameter state: a reused optimizer must start each client from none, at the round's lr
    ("fedavg", dict(optim="adamw_torch", local_epochs=2.0)),
    # SAM + SCAFFOLD with gradient accumulation: saved w, earlier micro-batches, the correction
    ("fedgamma", dict(local_steps=2, gradient_accumulation_steps=2, rho=0.1)),
    # LESAM: the fixed offset added and w restored every step; w_old as client state
    ("fedlesam", dict(local_steps=3, rho=0.2)),
    # the client loop's stopping rules: a fractional epoch count, accumulation with a short last step
    ("scaffold", dict(local_epochs=1.5, gradient_accumulation_steps=3, max_grad_norm=0.5)),
    # max_steps past one epoch, no clipping, a linear schedule; the corrections applied to p.grad in place
    ("fedprox", dict(local_steps=7, max_grad_norm=0.0, lr_scheduler_type="linear")),
    ("fedup", dict(local_steps=3, fedup_alpha=0.5)),
    ("fedlesam_d", dict(local_steps=3, rho=0.2, feddyn_alpha=0.3)),
    ("fedlesam_s", dict(local_steps=3, rho=0.2)),
    # SAM's two passes with accumulation and clipping that always cuts (norm 0.05)
    ("fedsam", dict(local_steps=3, gradient_accumulation_steps=2, rho=0.1, max_grad_norm=0.05)),
])
def test_reused_trainer_equals_rebuilding_everything_per_client(tmp_path, algorithm, overrides):
    fast_trainer, fast, fast_trace = run(tmp_path / "fast", reuse=True, fed_algorithm=algorithm, **overrides)
    _, reference, reference_trace = run(tmp_path / "reference", reuse=False, fed_algorithm=algorithm, **overrides)
    torch.testing.assert_close(fast.params, reference.params, rtol=0, atol=0)
    assert [r["train_loss"] for r in fast.history] == [r["train_loss"] for r in reference.history]
    # the fast path was really taken: one optimizer for all 12 client rounds, and for corrections after a
    # single pass, the in-place correction of p.grad (the reference used flat vectors)
    assert len({id(o) for o in fast_trace.optimizers}) == 1
    assert len({id(o) for o in reference_trace.optimizers}) == 12
    in_place = fast_trainer.client_trainer.in_place_steps
    assert (in_place > 0) == (algorithm in ("scaffold", "fedprox", "fedup", "fedlesam", "fedlesam_d", "fedlesam_s"))
    assert [r["local_steps"] for r in fast.history] == [r["local_steps"] for r in reference.history]
    assert (fast.params - run(tmp_path / "other", reuse=True, fed_algorithm=algorithm, seed=8, **overrides)[1].params
            ).abs().max() > 1e-4  # a different seed changes the result: the comparison has teeth


def test_seed_for_client_gives_set_seed_generators(tmp_path):
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=2, clients_per_round=2,
                                partition_scheme="iid")
    client = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels").client_trainer
    draws = []
    for seeding in (set_seed, client.seed_for_client):
        seeding(1234)
        draws.append((torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random(), torch.randperm(9).tolist()))
    assert draws[0] == draws[1]
    if not torch.cuda.is_initialized():  # no CUDA seeding call queued per client
        queued = len(getattr(torch.cuda, "_queued_calls", []))
        for seed in range(20):
            client.seed_for_client(seed)
        assert len(getattr(torch.cuda, "_queued_calls", [])) == queued


@pytest.mark.parametrize("algorithm", ["scaffold", "fedlesam_d"])
def test_workspace_vectors_are_split_once_per_client_not_every_step(tmp_path, monkeypatch, algorithm):
    calls = []
    original = ParameterSpace.split
    monkeypatch.setattr(ParameterSpace, "split", lambda self, flat: calls.append(1) or original(self, flat))

    def splits(local_steps):
        calls.clear()
        trainer, _, _ = run(tmp_path / f"steps{local_steps}", reuse=True, fed_algorithm=algorithm,
                            local_steps=local_steps, rho=0.1)
        assert trainer.client_trainer.in_place_steps == 12 * local_steps
        return len(calls)

    assert splits(2) == splits(6)  # 4 more corrected steps per client, not one split more
