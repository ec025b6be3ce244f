"""Client rows of a dataset with an on-the-fly transform, each batch read by one ``dataset[rows]`` call
(``hf_fedflat.runtime.transform_rows``, mechanism ``transform_batches``): the same batches and random draws as the
Trainer's path over ``Dataset.select`` subsets, so the same weights, losses and evaluations bit for bit, through the
lean client loop and through the Trainer's own loop; batches the default collator would change go through it."""

from __future__ import annotations

import tempfile

import datasets
import numpy as np
import pytest
import torch
from transformers import default_data_collator

from hf_fedflat import FedTrainingArguments, create_trainer, runtime
from hf_fedflat.runtime.transform_rows import TransformedRows, TransformedSource

from helpers.random_draws import DropoutClassifier, noisy_train_data


def settings(tmp, **overrides) -> dict:
    values = dict(output_dir=tmp, use_cpu=True, num_clients=6, clients_per_round=3, num_rounds=4,
                  per_device_train_batch_size=5, partition_scheme="iid", learning_rate=0.1, seed=7,
                  remove_unused_columns=False, eval_every_n_rounds=1, per_device_eval_batch_size=7)
    return values | overrides


def run(tmp, **overrides):
    torch.manual_seed(0)
    # the random augmentation runs in training and in every evaluation (it is not declared deterministic)
    trainer = create_trainer(DropoutClassifier(), FedTrainingArguments(**settings(tmp, **overrides)),
                             noisy_train_data(), noisy_train_data().select(range(40)), label_column="labels")
    output = trainer.train()
    clients = [trainer.local_training.client_dataset(c) for c in range(6)]
    return output, clients


@pytest.mark.parametrize("overrides", [dict(local_epochs=1.5, gradient_accumulation_steps=2),
                                       dict(local_steps=4, dataloader_drop_last=True, fed_algorithm="fedsam",
                                            rho=0.1)])
def test_weights_losses_and_evaluations_equal_the_trainers_path(overrides):
    with tempfile.TemporaryDirectory() as tmp:
        with runtime.fast_path(True):
            fast, fast_clients = run(tmp + "/fast", **overrides)
        with runtime.fast_path(True, without=["client_loop"]):  # the Trainer's DataLoader over the same rows
            loop, loop_clients = run(tmp + "/loop", **overrides)
        with runtime.fast_path(False):
            reference, reference_clients = run(tmp + "/reference", **overrides)
        assert all(type(c) is TransformedRows for c in fast_clients + loop_clients)
        assert all(isinstance(c, datasets.Dataset) for c in reference_clients)  # Dataset.select subsets
        for other in (loop, reference):
            assert torch.equal(fast.params, other.params)
            for a, b in zip(fast.history, other.history):
                assert (a["train_loss"], a["eval_loss"]) == (b["train_loss"], b["eval_loss"])
        with runtime.fast_path(True):
            seeded, _ = run(tmp + "/seed", seed=8, **overrides)
        assert not torch.equal(fast.params, seeded.params)  # the comparison has teeth


def rows_of(table: dict, transform, indices):
    dataset = datasets.Dataset.from_dict(table).with_transform(transform)
    return dataset, TransformedSource(dataset, default_data_collator).rows(indices)


@pytest.mark.parametrize("transform", [
    lambda b: {"x": torch.tensor(b["x"]), "labels": torch.tensor(b["y"])},  # tensors: the batch itself
    lambda b: {"x": np.asarray(b["x"], dtype=np.float32), "labels": b["y"]},  # numpy and lists: the collator's
    lambda b: {"x": torch.tensor(b["x"]), "label": torch.tensor(b["y"], dtype=torch.float64)},  # label -> labels
    lambda b: {"x": torch.tensor(b["x"]).t(), "labels": torch.tensor(b["y"])},  # not one entry per row
])
def test_a_batch_is_what_the_default_collator_makes_of_its_rows(transform):
    table = {"x": [[float(i), float(i) / 3] for i in range(10)], "y": [i % 3 for i in range(10)]}
    indices = [7, 2, 9, 4, 0]
    dataset, rows = rows_of(table, transform, indices)
    positions = [3, 0, 4]
    expected = default_data_collator(dataset.__getitems__([indices[p] for p in positions]))
    got = rows.batch(torch.tensor(positions))
    assert list(got) == list(expected)
    for key in got:
        assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key])
    assert rows.__getitems__(positions)[0].batch.keys() == expected.keys()
    assert len(rows) == 5



@pytest.mark.parametrize("selected", [False, True])
def test_consecutive_rows_are_one_batch_of_the_same_rows(selected):
    """Consecutive rows (an evaluation's batches) are read through a slice: the transform sees one batch of the same
    rows as with their list, also through a dataset's indices mapping (a ``select``)."""
    seen = []

    def transform(b):
        seen.append(list(b["y"]))
        return {"x": torch.tensor(b["x"]), "labels": torch.tensor(b["y"])}

    table = {"x": [[float(i), float(i) / 4] for i in range(10)], "y": list(range(10))}
    dataset = datasets.Dataset.from_dict(table)
    if selected:
        dataset = dataset.select([9, 8, 7, 6, 5])
    rows = TransformedSource(dataset.with_transform(transform), default_data_collator).rows(range(len(dataset)))
    got = rows.batch([1, 2, 3])
    expected_rows = [8, 7, 6] if selected else [1, 2, 3]
    assert seen == [expected_rows]
    assert torch.equal(got["x"], torch.tensor([[float(r), r / 4] for r in expected_rows]))
    assert torch.equal(got["labels"], torch.tensor(expected_rows))
    rows.batch([3, 1])  # not consecutive: the rows' list
    assert seen[-1] == ([6, 8] if selected else [3, 1])

def test_switch_and_unsupported_settings_keep_the_select():
    from types import SimpleNamespace

    from hf_fedflat.runtime.transform_rows import transformed_source

    with tempfile.TemporaryDirectory() as tmp:
        with runtime.fast_path(True, without=["transform_batches"]):
            _, without = run(tmp + "/without", num_rounds=1)
    assert all(isinstance(c, datasets.Dataset) for c in without)
    dataset = noisy_train_data()

    def source(data=dataset, processes=1, **changed):
        args = dict(remove_unused_columns=False, train_sampling_strategy="random", dataloader_num_workers=0,
                    world_size=1) | changed
        trainer = SimpleNamespace(args=SimpleNamespace(**args), accelerator=SimpleNamespace(num_processes=processes),
                                  data_collator=default_data_collator)
        return transformed_source(trainer, data)

    assert isinstance(source(), TransformedSource)
    assert source(data=dataset.with_format(None)) is None  # no transform: materialised or the Trainer's path
    assert source(remove_unused_columns=True) is None  # the Trainer would drop the transform's input columns
    assert source(train_sampling_strategy="group_by_length") is None
    assert source(dataloader_num_workers=2) is None
    assert source(processes=2) is None
