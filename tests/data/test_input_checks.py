"""Labels and inputs are checked against the model once, before any round.

Each bad input is refused by ``FederatedTrainer(...)`` itself (no round runs) with an error that names the split,
the column and the count of bad rows; ``drop_invalid_rows`` drops exactly those rows, records the counts
(``data_validation.json``, ``federated_config.json``) and the run trains.
"""

from __future__ import annotations

import json
import math

import datasets
import numpy as np
import pytest
import torch

from hf_fedflat import FedTrainingArguments, FederatedCallback, FederatedTrainer
from hf_fedflat.data.input_checks import (
    InvalidInputError,
    model_label_space,
    num_labels_from_data,
    validate_inputs,
)

from conftest import TinyClassifier, make_tiny_dataset

N = 24


class Tiny3(TinyClassifier):
    """The tiny MLP declaring its 3 classes (as a transformers model does with ``config.num_labels``)."""

    num_labels = 3


def tiny(n=N, seed=1, labels=None, x=None, label_type=None, column="labels"):
    """The tiny dataset with some labels / inputs replaced (``{row: value}``)."""
    base = make_tiny_dataset(n=n, seed=seed).with_format(None).to_dict()
    ys, xs = list(base["labels"]), [list(r) for r in base["x"]]
    for row, value in (labels or {}).items():
        ys[row] = value
    for row, value in (x or {}).items():
        xs[row] = [value] * len(xs[row])
    if label_type is not None:
        ys = [label_type(v) for v in ys]
    data = {"x": xs, column: ys}
    return datasets.Dataset.from_dict(data).with_format("torch", columns=["x", column])


def args(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedavg", num_clients=3, clients_per_round=3,
                    num_rounds=2, local_steps=1, per_device_train_batch_size=4, partition_scheme="iid",
                    learning_rate=0.1, seed=3)
    settings.update(overrides)
    return FedTrainingArguments(**settings)


class NoRounds(FederatedCallback):
    """A callback that fails the test if a round starts."""

    def on_round_begin(self, trainer, *a, **k):  # pragma: no cover - must not run
        raise AssertionError("a round started")


# (case, train, eval, the message's lines (each must appear), bad train rows, bad eval rows)
CASES = [
    ("minus-one label", lambda: tiny(labels={0: -1, 5: -1}), lambda: tiny(n=9, seed=2),
     ["train: 2 of 24 rows have a negative label other than the ignore index -100", "[column 'labels']",
      "row 0: label -1"], 2, 0),
    ("label >= num_labels", lambda: tiny(labels={3: 3, 4: 7, 9: 3}), lambda: tiny(n=9, seed=2),
     ["train: 3 of 24 rows have a label >= num_labels (3)", "row 4: label 7 >= num_labels 3"], 3, 0),
    ("NaN pixels", lambda: tiny(x={2: float("nan"), 7: float("inf")}), lambda: tiny(n=9, seed=2),
     ["train: 2 of 24 rows have NaN/Inf in a float input", "column 'x'"], 2, 0),
    ("all -100 labels", lambda: tiny(labels={1: -100, 2: -100, 3: -100, 4: -100}), lambda: tiny(n=9, seed=2),
     ["train: 4 of 24 rows have no label to learn from (every label is -100"], 4, 0),
    ("out-of-range test labels", lambda: tiny(), lambda: tiny(n=9, seed=2, labels={0: 5, 8: -2}),
     ["eval: 1 of 9 rows have a label >= num_labels (3)", "eval: 1 of 9 rows have a negative label"], 0, 2),
    ("everything at once", lambda: tiny(labels={0: -1, 1: 9, 2: -100}, x={3: float("nan"), 0: float("nan")}),
     lambda: tiny(n=9, seed=2, labels={4: 3}),
     ["train: 1 of 24 rows have a negative label", "train: 1 of 24 rows have a label >= num_labels (3)",
      "train: 1 of 24 rows have no label to learn from", "train: 2 of 24 rows have NaN/Inf in a float input",
      "eval: 1 of 9 rows have a label >= num_labels (3)"], 4, 1),
]


@pytest.mark.parametrize("case,train,test,lines,bad_train,bad_eval", CASES, ids=[c[0] for c in CASES])
def test_bad_rows_are_refused_before_any_round(tmp_path, case, train, test, lines, bad_train, bad_eval):
    with pytest.raises(InvalidInputError) as error:
        FederatedTrainer(Tiny3(), args(tmp_path), train(), test(), label_column="labels", callbacks=[NoRounds()])
    message = str(error.value)
    for line in lines:
        assert line in message, (line, message)
    assert "--drop_invalid_rows" in message
    assert not (tmp_path / "history.json").exists() and not (tmp_path / "final_model").exists()
    report = error.value.report
    assert int(report.splits["train"].invalid_rows().size) == bad_train
    assert int(report.splits["eval"].invalid_rows().size) == bad_eval


@pytest.mark.parametrize("case,train,test,lines,bad_train,bad_eval", CASES[:1] + CASES[-1:],
                         ids=[CASES[0][0], CASES[-1][0]])
def test_drop_invalid_rows_drops_records_and_trains(tmp_path, case, train, test, lines, bad_train, bad_eval):
    train_ds, test_ds = train(), test()
    trainer = FederatedTrainer(Tiny3(), args(tmp_path), train_ds, test_ds, label_column="labels",
                               drop_invalid_rows=True)
    assert len(trainer.train_dataset) == N - bad_train and len(trainer.eval_dataset) == 9 - bad_eval
    assert sum(trainer.client_sizes) == N - bad_train  # the partition is made on the kept rows
    kept = trainer.train_dataset.with_format("numpy")[:]
    assert ((kept["labels"] >= 0) & (kept["labels"] < 3)).all() and np.isfinite(kept["x"]).all()
    output = trainer.train()
    assert [r["num_clients"] for r in output.history] == [3, 3]
    assert all(math.isfinite(r["train_loss"]) and math.isfinite(r["eval_loss"]) for r in output.history)
    recorded = json.loads((tmp_path / "data_validation.json").read_text())
    assert recorded["drop_invalid_rows"] is True and recorded["num_labels"] == 3
    assert recorded["splits"]["train"]["dropped_rows"] == bad_train
    assert recorded["splits"]["eval"]["dropped_rows"] == bad_eval
    config = json.loads((tmp_path / "final_model" / "federated_config.json").read_text())
    assert config["dropped_invalid_rows"]["train"]["rows"] == bad_train
    # the same counts per problem in both records
    assert config["dropped_invalid_rows"]["train"]["problems"] == recorded["splits"]["train"]["problems"]


def test_minus_one_does_not_become_a_class(tmp_path):
    """Without the check, -1 was one more class of the partition (np.unique of the labels): 4 columns for 3 classes."""
    train = tiny(labels={0: -1, 1: -1})
    assert num_labels_from_data(train, "labels") == 3  # -1 is no class: 1 + the largest valid id
    trainer = FederatedTrainer(Tiny3(), args(tmp_path), train, None, label_column="labels", drop_invalid_rows=True)
    assert trainer.partition.class_names == ["0", "1", "2"]
    assert int(trainer.partition.label_counts.sum()) == N - 2


def test_string_labels_refused_even_with_drop(tmp_path):
    train = tiny(label_type=lambda v: ["cat", "dog", "fox"][v])
    with pytest.raises(InvalidInputError, match=r"train: label column 'labels' holds strings \('.*'.*class_encode_column"):
        FederatedTrainer(Tiny3(), args(tmp_path), train, None, label_column="labels", drop_invalid_rows=True)


def test_float_labels_refused_for_a_classifier(tmp_path):
    train = tiny(label_type=float)
    with pytest.raises(InvalidInputError, match=r"label column 'labels' holds floats, but the model is a classifier "
                                                r"with 3 classes \(model.num_labels\)"):
        FederatedTrainer(Tiny3(), args(tmp_path), train, None, label_column="labels")


def test_nan_made_by_a_transform_is_refused(tmp_path):
    """A lazily transformed dataset: the stored columns are read in full, the first rows through the transform."""
    train = tiny().with_format(None)

    def normalise(batch):  # std 0: every pixel NaN
        x = torch.tensor(batch["x"])
        return {"x": (x - x) / torch.zeros(()), "labels": torch.tensor(batch["labels"])}

    train.set_transform(normalise)
    with pytest.raises(InvalidInputError, match=r"train: the dataset's transform makes NaN/Inf in 'x' \(8 of the first "
                                                r"8 valid rows"):
        FederatedTrainer(Tiny3(), args(tmp_path), train, None, label_column="labels", drop_invalid_rows=True)


def test_token_labels_checked_against_the_vocabulary():
    """Sequence labels of a language model: each token id < vocabulary size; rows of only -100 have nothing to learn."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    space = model_label_space(model)
    assert space.vocab_size == 50
    train = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4,
                                        "labels": [[-100, 2, 3], [-100, -100, -100], [1, 60, 3], [-100, 4, -1]]})
    with pytest.raises(InvalidInputError) as error:
        validate_inputs(model, train)
    message = str(error.value)
    assert "train: 1 of 4 rows have a label >= the model's vocabulary size (50)" in message
    assert "train: 1 of 4 rows have no label to learn from" in message
    assert "train: 1 of 4 rows have a negative label other than the ignore index -100" in message
    kept, _, _, report = validate_inputs(model, train, drop_invalid_rows=True)
    assert kept["labels"] == [[-100, 2, 3]] and report.dropped["train"]["rows"] == 3


def test_a_client_left_empty_by_the_drop_is_refused(tmp_path):
    """A partition that comes with the data (leave-one-domain-out, Shakespeare's roles): its indices are remapped
    after a drop; a client whose every label is -100 would train on nothing (NaN loss) and is refused, by name."""
    from hf_fedflat.data import ClientPartition

    ys = make_tiny_dataset(n=12, seed=1).with_format(None)["labels"]
    owners = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]

    def partition():
        counts = np.zeros((3, 3), dtype=np.int64)
        for client, rows in enumerate(owners):
            for row in rows:
                counts[client, ys[row]] += 1
        return ClientPartition(owners, counts, "natural", None, 0, ["0", "1", "2"], num_rows=12)

    all_ignored = tiny(n=12, labels={4: -100, 5: -100, 6: -100, 7: -100})
    with pytest.raises(InvalidInputError, match=r"client\(s\) 1 of the partition that comes with the data would have "
                                                r"no row left .*4 with no label to learn from"):
        FederatedTrainer(Tiny3(), args(tmp_path), all_ignored, None, label_column="labels", partition=partition(),
                         drop_invalid_rows=True)
    one_bad = tiny(n=12, labels={5: 7})
    trainer = FederatedTrainer(Tiny3(), args(tmp_path), one_bad, None, label_column="labels", partition=partition(),
                               drop_invalid_rows=True)
    assert [idx.tolist() for idx in trainer.partition.client_indices] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9, 10]]
    assert trainer.partition.label_counts.sum(axis=1).tolist() == [4, 3, 4]
    assert trainer.partition.num_rows == 11


def test_experiment_reads_drop_invalid_rows_from_data_arguments(tmp_path):
    """The CLI's path: a registered dataset whose labels include -1; DataArguments.drop_invalid_rows drops them."""
    from hf_fedflat.data.arguments import DataArguments
    from hf_fedflat.data.catalog import DATASETS, FederatedData, register_dataset
    from hf_fedflat.cli.experiment import build_experiment
    from hf_fedflat.models.arguments import ModelArguments

    if "digits_with_missing_labels" not in DATASETS:
        @register_dataset("digits_with_missing_labels")
        def _load(data_args, model_args, seed):
            from hf_fedflat.data.digits import load_digits_dataset

            data = load_digits_dataset(image_size=8, test_fraction=0.2, seed=seed)
            train = data["train"].select(range(120))
            transform = train.format["format_kwargs"]["transform"]  # decoded + normalised when read
            train = train.with_format(None).map(lambda row, i: {"label": -1 if i % 10 == 0 else row["label"]},
                                                with_indices=True)
            train.set_transform(transform)
            return FederatedData(name="digits", train=train, eval=data["test"].select(range(40)), num_classes=10,
                                 in_chans=1)

    model_args = ModelArguments("small_cnn", image_size=8)
    with pytest.raises(InvalidInputError, match=r"train: 12 of 120 rows have a negative label .*\[column 'label'\]"):
        build_experiment(DataArguments("digits_with_missing_labels"), model_args, args(tmp_path))
    experiment = build_experiment(DataArguments("digits_with_missing_labels", drop_invalid_rows=True), model_args,
                                  args(tmp_path))
    assert len(experiment.trainer.train_dataset) == 108
    assert experiment.trainer.input_report.dropped == {"train": {"rows": 12, "problems": {"label_negative": 12}}}


def test_nan_pixels_of_a_lazily_transformed_image_dataset(tmp_path):
    """NaN pixels in stored images (digits, decoded and normalised by a transform when read):
    counted from the stored column, droppable; the model is sized from its config (num_labels 10)."""
    from hf_fedflat.data.digits import load_digits_dataset
    from hf_fedflat.models import create_model

    data = load_digits_dataset(image_size=8, test_fraction=0.2, seed=0)
    raw = data["train"].with_format(None).select(range(200))
    images = np.array(raw.with_format("numpy")["image"], dtype=np.float32)
    images[[3, 10, 150], 2, 5] = np.nan
    bad = datasets.Dataset.from_dict({"image": images, "label": raw["label"]}, features=raw.features)
    bad.set_transform(data["train"].format["format_kwargs"]["transform"])
    model = create_model("small_cnn", num_classes=10, in_chans=1, image_size=8)
    with pytest.raises(InvalidInputError) as error:
        FederatedTrainer(model, args(tmp_path), bad, data["test"], callbacks=[NoRounds()])
    assert "num_labels = 10 from model.config.num_labels" in str(error.value)
    assert "train: 3 of 200 rows have NaN/Inf in a float input [inputs] (e.g. row 3: column 'image'" in str(error.value)
    trainer = FederatedTrainer(model, args(tmp_path), bad, data["test"], drop_invalid_rows=True)
    assert len(trainer.train_dataset) == 197 and trainer.input_report.dropped["train"]["rows"] == 3
    assert torch.isfinite(trainer.train_dataset[:197]["pixel_values"]).all()
