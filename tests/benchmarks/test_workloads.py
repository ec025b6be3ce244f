"""benchmarks/workloads.py on tiny sizes: the plain loop and FederatedTrainer do the same steps (equal final
weights, also when a client's local steps run past one epoch), the generated play set builds into LEAF
Shakespeare with the counts asked for, FEMNIST-shaped writers partition one client per writer. No timing."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch
from transformers import set_seed
from transformers.modeling_outputs import SequenceClassifierOutput

from hf_fedflat.data.partition import natural_id_partition
from hf_fedflat.models import create_model

from helpers import load_benchmark

@pytest.fixture(scope="module")
def W():
    module = load_benchmark("workloads")
    yield module
    del sys.modules[module.__name__]


@pytest.fixture(scope="module")
def shakespeare(W):
    job = W.Job(num_rounds=2, num_clients=0, clients_per_round=3, batch_size=10, learning_rate=0.8, local_steps=2)
    workload, info = W.shakespeare_workload(job, None, scale=0.01)

    def small_lstm():  # LEAF's architecture, narrower: the test is about the steps, not the model
        set_seed(job.seed)
        return create_model("char_lstm", hidden_size=8, num_layers=1)

    workload.make_model = small_lstm
    return workload, info


def test_generated_play_set_builds_the_counts_asked_for(shakespeare):
    _, info = shakespeare
    written = info["generated_play_set"]
    assert written["long_roles"] == round(806 * 0.01) == info["clients"]  # every long role is a client
    assert written["roles"] == round(806 * 0.01) + round(323 * 0.01) + round(194 * 0.01)
    # LEAF's split keeps ~0.8 of each role's windows for train; the sizes sum to the sdist's, scaled
    assert abs(info["train_windows"] - 3_283_030 * 0.01) < 0.05 * 3_283_030 * 0.01


def test_plain_loop_and_federated_trainer_give_the_same_weights(W, shakespeare):
    workload, _ = shakespeare
    plain = W.run_plain(workload)
    fedavg = W.run_trainer(workload, "fedavg")
    assert plain.round_steps == fedavg.round_steps == [3 * 2, 3 * 2]
    assert torch.equal(plain.final_params, fedavg.final_params)
    initial = torch.nn.utils.parameters_to_vector(workload.make_model().parameters()).detach()
    assert not torch.equal(plain.final_params, initial)


def test_local_steps_past_one_epoch_follow_the_trainers_reshuffle(W, shakespeare):
    workload, _ = shakespeare
    # 3 rows per client: 2 batches of 2 per epoch, 5 steps = 3 epochs (each shuffled with its own seed)
    small = [np.asarray(ix[:3]) for ix in workload.partition.client_indices]
    from hf_fedflat.data.partition import ClientPartition

    partition = ClientPartition(client_indices=small, label_counts=np.full((len(small), 1), 3, dtype=np.int64),
                                scheme="natural_id", alpha=None, seed=0, class_names=["all"],
                                num_rows=workload.partition.num_rows)
    job = dataclasses.replace(workload.job, batch_size=2, local_steps=5)
    tiny = dataclasses.replace(workload, job=job, partition=partition)
    order = W.client_order(job, 0, 1, 3)
    assert [len(b) for b in order] == [2, 1, 2, 1, 2]
    assert sorted(torch.cat(order[:2]).tolist()) == [0, 1, 2]  # each epoch visits every row once
    plain, fedavg = W.run_plain(tiny), W.run_trainer(tiny, "fedavg")
    assert plain.round_steps == fedavg.round_steps == [3 * 5, 3 * 5]
    assert torch.equal(plain.final_params, fedavg.final_params)


class TinyCharModel(torch.nn.Module):
    """Next character from the mean of the window's embeddings: linear layers, which CPU autocast runs in bf16."""

    def __init__(self, vocab: int = 128):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, 8)
        self.head = torch.nn.Linear(8, vocab)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embedding(input_ids).mean(dim=1))
        return SequenceClassifierOutput(loss=torch.nn.functional.cross_entropy(logits, labels), logits=logits)


def test_bf16_autocast_gives_both_sides_the_same_weights(W, shakespeare):
    """``--bf16`` (run on the CPU here; ``--device cuda`` on a GPU): the plain loop's forward under bf16 autocast as
    the Trainer's ``bf16=True`` puts it, the same weights."""
    workload, _ = shakespeare

    def tiny_char_model():  # (no LSTM: this CPU's oneDNN has no bf16 LSTM; a GPU run uses LEAF's)
        set_seed(workload.job.seed)
        return TinyCharModel()

    bf16 = dataclasses.replace(workload, job=dataclasses.replace(workload.job, bf16=True), make_model=tiny_char_model)
    plain, fedavg = W.run_plain(bf16), W.run_trainer(bf16, "fedavg")
    assert torch.equal(plain.final_params, fedavg.final_params)
    fp32 = dataclasses.replace(bf16, job=workload.job)
    assert not torch.equal(plain.final_params, W.run_plain(fp32).final_params)  # autocast changed the arithmetic


def test_device_profile_counts_host_reads_over_the_middle_rounds(W, shakespeare):
    workload, _ = shakespeare
    longer = dataclasses.replace(workload, job=dataclasses.replace(workload.job, num_rounds=4))
    for side in (lambda gate: W.run_plain(longer, gate), lambda gate: W.run_trainer(longer, "fedavg", gate)):
        profile = W.device_profile(side, longer.job)
        assert profile["steps"] == 2 * 3 * 2  # rounds 1 and 2 of 4, 3 clients x 2 steps
        assert profile["host_reads_per_step"] > 0  # (the shuffles' and the updates' reads; no sync on a CPU)
        assert profile["gpu_utilisation_percent"] is None  # no GPU here


def test_lock_step_compare_records_ratios_and_equal_weights(W, shakespeare):
    workload, _ = shakespeare
    records = W.compare(workload, {"scaffold": 1.10}, repeats=1)
    names = [r["name"] for r in records]
    assert names == ["shakespeare_fedavg_vs_plain_loop", "shakespeare_scaffold_vs_fedavg"]
    assert records[0]["details"]["max_abs_weight_diff"] == 0.0
    assert all(r["ratio"] > 0 and "load_avg_before" in r["details"] for r in records)


def test_femnist_writers_partition_one_client_per_writer(W):
    import datasets

    rows = W.femnist_rows(30, seed=1)
    raw = datasets.Dataset.from_dict(rows)
    partition = natural_id_partition(raw, "writer_id", label_column="labels")
    assert partition.num_clients == 30
    sizes = np.bincount(np.unique(rows["writer_id"], return_inverse=True)[1])
    assert sorted(partition.num_samples) == sorted(sizes.tolist())
    assert all(10 <= n <= 500 for n in sizes)
    batch = W.femnist_images({"seed": [0, 1], "labels": [3, 61]})
    assert batch["pixel_values"].shape == (2, 1, 28, 28) and batch["labels"].tolist() == [3, 61]


def test_natural_id_partition_equals_flwrs_natural_id_partitioner():
    import datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    rng = np.random.default_rng(5)
    pool = ["b", "a", "B", "a_1", "Zed", "10", "9", "ü", "a b", "f0001_01", "f0001_1"]
    ids = [pool[i] for i in rng.integers(0, len(pool), 300)]
    raw = datasets.Dataset.from_dict({"writer": ids, "labels": rng.integers(0, 4, 300).tolist()})
    partition = natural_id_partition(raw, "writer", label_column="labels")
    flwr = NaturalIdPartitioner(partition_by="writer")
    flwr.dataset = raw.add_column("row", list(range(300)))
    expected = [sorted(flwr.load_partition(pid)["row"]) for pid in range(flwr.num_partitions)]
    assert [ix.tolist() for ix in partition.client_indices] == expected
    numbers = datasets.Dataset.from_dict({"user": rng.integers(0, 30, 200).tolist(), "labels": [0] * 200})
    partition = natural_id_partition(numbers, "user", label_column="labels")  # int ids: sorted as strings
    names = sorted({str(v) for v in numbers["user"]})
    assert [sorted({str(numbers["user"][i]) for i in ix}) for ix in partition.client_indices] == [[n] for n in names]


def test_algorithms_compared_on_workloads_1_and_2_default_to_six_methods_and_refuse_others(W):
    import argparse

    assert W.algorithm_targets(argparse.Namespace(algorithms=None)) == {
        "fedup": 1.10, "fedlesam": 1.10, "fedprox": 1.10, "scaffold": 1.10, "fedsam": 2.2, "fedgam": 2.2}
    assert W.algorithm_targets(argparse.Namespace(algorithms="fedsam,fedlesam")) == {"fedsam": 2.2, "fedlesam": 1.10}
    with pytest.raises(SystemExit, match="fedavg"):
        W.algorithm_targets(argparse.Namespace(algorithms="fedlesam,fedavg"))
