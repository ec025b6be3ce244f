"""Recycled model-sized vectors: reused only when nothing refers to them, invisible to training."""

from __future__ import annotations

import threading

import pytest
import torch

from hf_fedflat import FederatedCallback, FedTrainingArguments, FederatedTrainer
from hf_fedflat.runtime import vectors
from hf_fedflat.runtime.vectors import BufferPool, VectorRecycler, recycle_vectors

from conftest import TinyClassifier
from helpers.runs import TEST, TRAIN

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
    assert vectors._active.recycler is None


def test_each_thread_recycles_with_its_own_recycler():
    """Two runs in two threads of one process: neither sees (nor, leaving its block, removes) the other's."""
    entered, other_done = threading.Event(), threading.Event()
    seen = {}

    def other_run():
        with recycle_vectors(N, torch.float32, "cpu") as mine:
            entered.set()
            other_done.wait(5)
            seen["other"] = vectors._active.recycler is mine

    with recycle_vectors(N, torch.float32, "cpu") as recycler:
        thread = threading.Thread(target=other_run)
        thread.start()
        assert entered.wait(5)
        assert vectors._active.recycler is recycler  # the other thread's block did not replace it
        other_done.set()
        thread.join(5)
        assert vectors._active.recycler is recycler  # nor did leaving it
        a = vectors.empty_like(torch.ones(N))
        address = a.data_ptr()
        del a
        assert vectors.empty_like(torch.ones(N)).data_ptr() == address
    assert seen == {"other": True}


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


def test_buffer_pool_reuses_a_dropped_buffer_and_never_one_still_viewed():
    pool = BufferPool(min_bytes=0)
    first = pool.take(1000)
    address = first.data_ptr()
    view = first[100:200].view(torch.float32)  # e.g. an unpacked tensor of a received message
    view.fill_(7.0)
    del first
    second = pool.take(900)  # the first buffer is still viewed: a new one
    assert second.untyped_storage().data_ptr() != address and pool.reused == 0
    assert bool((view == 7.0).all())
    second_address = second.data_ptr()
    del view, second
    third = pool.take(1000)  # both are free now: one of them comes back
    assert third.data_ptr() in (address, second_address) and pool.reused == 1
    assert third.dtype == torch.uint8 and third.shape == (1000,)


def test_buffer_pool_takes_the_smallest_free_buffer_that_fits_and_stays_bounded():
    pool = BufferPool(max_buffers=2, min_bytes=0, slack=0.0)
    small, large = pool.take(100), pool.take(10_000)
    small_address, large_address = small.data_ptr(), large.data_ptr()
    del small, large
    assert pool.take(50).data_ptr() == small_address  # (dropped at once: free again)
    assert pool.take(5_000).data_ptr() == large_address
    assert pool.take(20_000).numel() == 20_000  # nothing fits: a new buffer, the oldest one forgotten
    assert len(pool._storages) == 2


def test_buffer_pool_leaves_small_messages_to_the_allocator():
    pool = BufferPool(min_bytes=1 << 16)
    buffers = [pool.take(100) for _ in range(3)]
    assert pool.reused == 0 and not pool._storages and all(b.numel() == 100 for b in buffers)
