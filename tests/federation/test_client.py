"""One bad client must not poison the global model: raising, NaN and oversized updates are excluded."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hf_fedflat import FedTrainingArguments, FederatedCallback, FederatedTrainer, build_algorithm
from hf_fedflat.data import ClientPartition
from hf_fedflat.federation.outcome import TrainingFailedError

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN


class Capture(FederatedCallback):
    def __init__(self):
        self.starts, self.updates = [], []

    def on_round_begin(self, trainer, round_index, clients, **kwargs):
        self.starts.append(trainer.space.flatten().clone())

    def on_aggregate(self, trainer, round_index, updates, **kwargs):
        self.updates.append(updates)


def make(tmp_path, partition=None, **overrides):
    settings = dict(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="scaffold", num_clients=6,
                    clients_per_round=6, num_rounds=2, local_steps=2, per_device_train_batch_size=4,
                    partition_scheme="iid", learning_rate=0.1, seed=3)
    settings.update(overrides)
    args = FedTrainingArguments(**settings)
    torch.manual_seed(0)
    capture = Capture()
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels", partition=partition,
                               callbacks=[capture])
    return trainer, capture


def inject(trainer, *, raises=(), nan=(), scale=None):
    original = trainer.train_client

    def faulty(client_id, *args, **kwargs):
        if client_id in raises:
            raise RuntimeError(f"disk on fire at client {client_id}")
        update = original(client_id, *args, **kwargs)
        if client_id in nan:
            update.delta[0] = float("nan")
        if scale and client_id in scale:
            update.delta.mul_(scale[client_id])
        return update

    trainer.train_client = faulty


def test_raising_nan_and_oversized_clients_are_excluded_and_logged(tmp_path, caplog):
    trainer, capture = make(tmp_path, max_update_norm=50.0)
    inject(trainer, raises={1}, nan={4}, scale={2: 1e4})
    with caplog.at_level(logging.WARNING, logger="hf_fedflat.federation.client"):
        output = trainer.train()
    for record in output.history:
        assert record["clients"] == [0, 3, 5] and record["num_clients"] == 3
        reasons = {f["client"]: f["reason"] for f in record["failed_clients"]}
        assert set(reasons) == {1, 2, 4}
        assert "RuntimeError: disk on fire at client 1" in reasons[1]
        assert "NaN or Inf" in reasons[4] and "exceeds max_update_norm=50.0" in reasons[2]
    assert "client 1 excluded from aggregation" in caplog.text
    # the global model is exactly the aggregation of the good clients, with weights renormalised over them
    algorithm = build_algorithm(trainer.args)
    last = capture.updates[-1]
    weights = torch.tensor([u.num_samples for u in last], dtype=torch.float64)
    expected = capture.starts[-1] + sum(float(w) * u.delta for w, u in zip(weights / weights.sum(), last))
    torch.testing.assert_close(output.params, expected, rtol=0, atol=1e-6)
    assert torch.isfinite(output.params).all() and algorithm.aggregator.name == "mean"
    # SCAFFOLD's state was written only for clients that were aggregated
    assert trainer.store.get(1) == {} and trainer.store.get(4) == {} and trainer.store.get(0)


def test_round_without_any_good_client_keeps_the_global_model(tmp_path):
    trainer, capture = make(tmp_path, clients_per_round=2, num_rounds=1, max_consecutive_failed_rounds=0)
    start = trainer.space.flatten().clone()
    inject(trainer, nan=set(range(6)))
    with pytest.raises(TrainingFailedError, match="No round aggregated any client") as failed:
        trainer.train()  # the run ends, but its model is the initial one: it fails (no final_model/)
    output = failed.value.output
    assert output.final_model_dir is None and not (tmp_path / "final_model").exists()
    torch.testing.assert_close(output.params, start, rtol=0, atol=0)
    assert output.history[0]["num_clients"] == 0 and "train_loss" not in output.history[0]
    assert len(output.history[0]["failed_clients"]) == 2 and "eval_accuracy" in output.history[0]


def test_a_bug_in_every_client_aborts_after_consecutive_rounds(tmp_path):
    trainer, _ = make(tmp_path, clients_per_round=2, num_rounds=5, max_consecutive_failed_rounds=2)
    inject(trainer, raises=set(range(6)))
    with pytest.raises(RuntimeError, match="2 consecutive rounds.*disk on fire"):
        trainer.train()


def test_empty_and_one_sample_clients(tmp_path):
    rows = np.arange(len(TRAIN))
    labels = np.asarray(TRAIN["labels"])
    indices = [np.array([], dtype=np.int64), rows[:1], rows[1:40], rows[40:96]]
    counts = np.stack([np.bincount(labels[i], minlength=3) for i in indices])
    partition = ClientPartition(indices, counts, "iid", None, 0, ["0", "1", "2"], num_rows=len(TRAIN))
    trainer, capture = make(tmp_path, partition=partition, num_clients=4, clients_per_round=4, num_rounds=1)
    output = trainer.train()
    record = output.history[0]
    assert record["failed_clients"] == [{"client": 0, "reason": "empty dataset: skipped"}]
    assert record["clients"] == [1, 2, 3]
    one = next(u for u in capture.updates[0] if u.client_id == 1)
    assert one.num_samples == 1 and one.num_steps == 2 and one.delta.abs().max() > 0  # trained on its one sample


def test_clients_without_a_full_batch_under_drop_last_are_skipped_with_the_reason(tmp_path, caplog):
    """``dataloader_drop_last`` leaves a client smaller than a batch no batch at all: it is skipped up front with
    a message that says so (the Trainer itself would raise "max_steps must be set" from deep inside)."""
    rows = np.arange(len(TRAIN))
    labels = np.asarray(TRAIN["labels"])
    indices = [rows[:3], rows[3:40], rows[40:96]]
    counts = np.stack([np.bincount(labels[i], minlength=3) for i in indices])
    partition = ClientPartition(indices, counts, "iid", None, 0, ["0", "1", "2"], num_rows=len(TRAIN))
    with caplog.at_level(logging.WARNING, logger="hf_fedflat"):
        trainer, capture = make(tmp_path, partition=partition, num_clients=3, clients_per_round=3, num_rounds=1,
                                dataloader_drop_last=True)
    assert "1 of 3 clients have fewer rows than one batch (4)" in caplog.text
    record = trainer.train().history[0]
    assert record["failed_clients"] == [{"client": 0, "reason": "3 rows, fewer than one batch of 4 with "
                                                                "dataloader_drop_last: skipped"}]
    assert record["clients"] == [1, 2] and all(u.num_steps == 2 for u in capture.updates[0])


def test_a_non_finite_new_state_is_caught_and_a_handed_back_global_model_is_not_checked_again(tmp_path, monkeypatch):
    import hf_fedflat.federation.client as client_module

    # SCAFFOLD: a NaN in the new c_i (not in the update) excludes the client and its state is not written
    trainer, _ = make(tmp_path / "scaffold", num_rounds=1)
    original = trainer.train_client

    def nan_state(client_id, *args, **kwargs):
        update = original(client_id, *args, **kwargs)
        if client_id == 3:
            update.state["scaffold"]["c_i"][0] = float("nan")
        return update

    trainer.train_client = nan_state
    record = trainer.train().history[0]
    assert [f["client"] for f in record["failed_clients"]] == [3] and "NaN or Inf" in record["failed_clients"][0]["reason"]
    assert trainer.store.get(3) == {} and trainer.store.get(2)

    # FedLESAM hands w^t back as w_old_i: checked once by the server's run, not again per client
    checked = []
    real_all_finite = client_module.all_finite
    monkeypatch.setattr(client_module, "all_finite", lambda tensors: checked.append(list(tensors)) or real_all_finite(tensors))
    trainer, capture = make(tmp_path / "lesam", fed_algorithm="fedlesam", num_rounds=1)
    trainer.train()
    start = capture.starts[0]
    assert len(checked) == 6 and all(len(tensors) == 1 for tensors in checked)  # the update's delta alone
    assert {id(tensors[0]) for tensors in checked} == {id(update.delta) for update in capture.updates[0]}
    assert all(torch.equal(trainer.store.get(c)["lesam"]["w_old"], start) for c in range(6))
