"""Recycled model-sized vectors: reused only when nothing refers to them, invisible to training."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer, vectors
from hf_fedflat.vectors import VectorRecycler, recycle_vectors

from conftest import TinyClassifier
from test_federated_run import TEST, TRAIN

N = 1000


def test_a_dropped_vector_is_handed_out_again():
    recycler = VectorRecycler(N, torch.float32, "cpu")
    first = recycler.empty()
    address = first.data_ptr()
    del first
    second = recycler.empty()
    assert second.data_ptr() == address and second.shape == (N,) and second.dtype == torch.float32
    assert recycler.reused == 1


@pytest.mark.parametrize("keep", ["tensor", "view", "storage_sharing_tensor"])
def test_a_vector_still_referred_to_is_never_handed_out(keep):
    recycler = VectorRecycler(N, torch.float32, "cpu")
    vector = recycler.empty().fill_(3.0)
    held = {"tensor": lambda v: v, "view": lambda v: v[10:20],
            "storage_sharing_tensor": lambda v: torch.empty(0).set_(v.untyped_storage(), 0, (N,))}[keep](vector)
    expected = held.clone()
    del vector
    others = [recycler.empty().fill_(-1.0) for _ in range(3)]
    assert all(o.data_ptr() != held.untyped_storage().data_ptr() for o in others)
    torch.testing.assert_close(held, expected, rtol=0, atol=0)
    assert recycler.reused == 0


def test_at_capacity_busy_vectors_are_forgotten_not_overwritten():
    recycler = VectorRecycler(N, torch.float32, "cpu", max_bytes=2 * N * 4)
    assert recycler.capacity == 2
    held = [recycler.empty().fill_(float(i)) for i in range(5)]  # all stay in use
    assert len({h.data_ptr() for h in held}) == 5
    assert all(bool((held[i] == float(i)).all()) for i in range(5))
    del held[4]  # tracked (it replaced an older one): reused
    assert recycler.empty() is not None and recycler.reused == 1


def test_no_budget_means_ordinary_allocations():
    recycler = VectorRecycler(N, torch.float32, "cpu", max_bytes=N * 4 - 1)
    assert recycler.capacity == 0
    for _ in range(3):
        recycler.empty()
    assert recycler.reused == 0


def test_module_helpers_recycle_only_inside_the_block_and_only_matching_vectors():
    like = torch.ones(N)
    outside = vectors.empty_like(like)
    del outside
    with recycle_vectors(N, torch.float32, "cpu") as recycler:
        a = vectors.zeros_like(like)
        assert bool((a == 0).all())
        address = a.data_ptr()
        del a
        assert vectors.empty_like(like).data_ptr() == address  # (dropped at once again)
        assert vectors.empty(N, torch.float32, "cpu").data_ptr() == address
        assert vectors.empty_like(torch.ones(N, dtype=torch.float64)).dtype == torch.float64  # other dtype
        assert vectors.empty_like(torch.ones(N + 1)).shape == (N + 1,)  # other size
        assert vectors.empty_like(torch.ones(10, N // 10)).shape == (10, N // 10)  # not flat
        with recycle_vectors(7, torch.float32, "cpu") as inner:
            assert vectors.empty_like(torch.ones(7)).shape == (7,)
        assert inner.reused == 0
        assert recycler.reused == 2
    assert vectors._active is None


class KeepUpdates(FederatedCallback):
    """Holds every update's delta (and a copy of its values when it arrived)."""

    def __init__(self):
        self.kept = []

    def on_client_end(self, trainer, round_index, update, **kwargs):
        self.kept.append((update.delta, update.delta.clone()))


def federated_run(tmp_path, algorithm, monkeypatch, budget):
    monkeypatch.setattr(vectors, "RECYCLER_MAX_BYTES", budget)
    args = FedTrainingArguments(
        output_dir=str(tmp_path / f"{algorithm}-{budget}"), use_cpu=True, fed_algorithm=algorithm, num_clients=6,
        clients_per_round=3, num_rounds=4, local_steps=3, per_device_train_batch_size=4, partition_scheme="iid",
        learning_rate=0.1, seed=3,
    )
    torch.manual_seed(0)
    keep = KeepUpdates()
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels", callbacks=[keep])
    return trainer.train(), keep


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedlesam", "fedup", "fedprox", "mofedsam", "feddyn"])
def test_training_with_recycling_equals_training_without(tmp_path, monkeypatch, algorithm):
    recycled, keep = federated_run(tmp_path, algorithm, monkeypatch, vectors.RECYCLER_MAX_BYTES)
    plain, _ = federated_run(tmp_path, algorithm, monkeypatch, 0)
    torch.testing.assert_close(recycled.params, plain.params, rtol=0, atol=0)
    assert [r["train_loss"] for r in recycled.history] == [r["train_loss"] for r in plain.history]
    # updates a callback kept from earlier rounds were not overwritten by later rounds' vectors
    assert len(keep.kept) == 12
    for delta, copy in keep.kept:
        torch.testing.assert_close(delta, copy, rtol=0, atol=0)
