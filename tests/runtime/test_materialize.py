"""Client data read once into tensors (``runtime.materialize``): the batches are the ``datasets`` formatter's
batches through the Trainer's default collator, row for row; what it cannot reproduce it refuses; a federated
run gives the same final weights with it and without it (and as a plain loop over tensors)."""

from __future__ import annotations

import importlib.util
import sys

import datasets
import numpy as np
import pytest
import torch
from transformers import Trainer, TrainingArguments
from transformers.data.data_collator import default_data_collator

from hf_fedflat.runtime import materialize as mat

from conftest import TinyClassifier
from helpers import REPO_ROOT


def make_trainer(tmp_path) -> Trainer:
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True)
    return Trainer(model=TinyClassifier(in_features=6), args=args, data_collator=default_data_collator)


def user_dataset(n: int = 23, fmt: str = "torch", **format_kwargs) -> datasets.Dataset:
    """Rows as users store them: nested lists of floats (2x3, reshaped to 6 by nothing: the model takes x (6,)),
    int labels, and a string column the model does not take."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).round(3)  # python floats (float64 in Arrow)
    ds = datasets.Dataset.from_dict({"x": x.tolist(), "labels": rng.integers(0, 3, n).tolist(),
                                     "name": [f"row{i}" for i in range(n)]})
    ds.set_format(fmt, **format_kwargs)
    return ds


def formatter_batch(trainer, dataset, rows) -> dict:
    """The Trainer's own path: the pruned dataset's rows through datasets' formatter, then the collator."""
    pruned = trainer._remove_unused_columns(dataset, description="training")
    return trainer.data_collator([pruned[int(i)] for i in rows])


def assert_same_batches(materialized, trainer, dataset, batches):
    for rows in batches:
        got = materialized.collate(torch.tensor(rows, dtype=torch.int64))
        expected = formatter_batch(trainer, dataset, rows)
        assert list(got) == list(expected)
        for key in expected:
            assert got[key].dtype == expected[key].dtype, key
            assert got[key].shape == expected[key].shape, key
            assert torch.equal(got[key], expected[key]), key


BATCHES = [[0, 1, 2, 3], [22, 5, 5, 0, 17], [11]]


@pytest.mark.parametrize("fmt", ["torch", "numpy"])
def test_arrow_read_gives_the_formatter_batches(tmp_path, fmt):
    trainer, dataset = make_trainer(tmp_path), user_dataset(fmt=fmt)
    pruned = trainer._remove_unused_columns(dataset, description="training")
    first = pruned[0]
    arrow = mat._arrow_columns(pruned, first, fmt)
    assert arrow is not None and set(arrow) == {"x", "labels"}  # the string column is not fed to the model
    assert arrow["x"].dtype == torch.float64 and arrow["labels"].dtype == torch.int64  # as Arrow stores them
    formatted = mat._formatted_columns(pruned, first, fmt)
    assert formatted["x"].dtype == torch.float32 and formatted["labels"].dtype == torch.int64  # datasets' casts
    materialized = mat.materialize(trainer, dataset)
    # stored wider than the format's rows: cast once (int8 ids stay int8, see below)
    assert materialized is not None and materialized.columns["x"].dtype == torch.float32
    assert materialized.nbytes == len(dataset) * (6 * 4 + 8)
    everything = torch.arange(len(dataset))
    for name in formatted:  # one formatted batch of all rows, value and dtype
        got = materialized.row(name, everything)
        assert got.dtype == formatted[name].dtype and torch.equal(got, formatted[name])
    row = materialized.rows(range(len(dataset)))[4]  # a single row as the format gives it
    assert all(torch.equal(mat._row_tensor(row[k]), mat._row_tensor(pruned[4][k])) for k in row)
    assert all(mat._row_tensor(row[k]).dtype == mat._row_tensor(pruned[4][k]).dtype for k in row)
    assert_same_batches(materialized, trainer, dataset, BATCHES)
    # a client's view: __getitems__ (what the DataLoader calls) returns the collated batch once per row
    view = materialized.rows([3, 7, 9, 11])
    items = view.__getitems__([2, 0])
    assert len(items) == 2 and items[0] is items[1]
    assert torch.equal(items[0].batch["x"], formatter_batch(trainer, dataset, [9, 3])["x"])
    collator = mat.wrap_collator(trainer.data_collator)
    assert collator(items) is items[0].batch
    assert torch.equal(collator([pruned[1]])["x"], formatter_batch(trainer, dataset, [1])["x"])


def test_int8_ids_are_kept_as_stored_and_cast_per_batch(tmp_path):
    """LEAF Shakespeare's layout: 80 int8 character ids per row (fixed-size list), int labels; the formatter gives
    int64, the materialised columns keep int8 (1/8 of the memory, within a budget int64 would exceed)."""
    rng = np.random.default_rng(2)
    n = 50
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int8"), length=80),
                                  "labels": datasets.Value("int64")})
    dataset = datasets.Dataset.from_dict({"input_ids": rng.integers(-128, 128, (n, 80)).tolist(),
                                          "labels": rng.integers(0, 80, n).tolist()}, features=features)
    dataset.set_format("torch")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True)

    class Ids(torch.nn.Module):
        def forward(self, input_ids, labels=None):
            return {"logits": input_ids.float()}

    trainer = Trainer(model=Ids(), args=args, data_collator=default_data_collator)
    assert dataset[0]["input_ids"].dtype == torch.int64
    stored = n * (80 * 1 + 8)
    assert mat.materialize(trainer, dataset, budget=stored - 1) is None
    materialized = mat.materialize(trainer, dataset, budget=stored)  # int64 ids would need n * (640 + 8)
    assert materialized is not None and materialized.columns["input_ids"].dtype == torch.int8
    assert materialized.nbytes == stored
    assert_same_batches(materialized, trainer, dataset, [[0, 49, 3, 3], [17]])


def test_indices_mapping_after_shuffle_and_select(tmp_path):
    trainer = make_trainer(tmp_path)
    dataset = user_dataset(n=40).shuffle(seed=3).select([5, 1, 30, 2, 8, 9, 12, 3, 39, 0, 21, 22, 23, 24, 25, 26,
                                                         27, 28, 29, 31, 32, 33, 34])
    assert dataset._indices is not None  # rows read through an indices mapping
    pruned = trainer._remove_unused_columns(dataset, description="training")
    assert mat._arrow_columns(pruned, pruned[0], "torch") is not None
    materialized = mat.materialize(trainer, dataset)
    assert materialized is not None and materialized.columns["x"].shape == (23, 6)
    assert_same_batches(materialized, trainer, dataset, BATCHES)


def test_format_kwargs_dtype_is_the_formatters_cast(tmp_path):
    trainer, dataset = make_trainer(tmp_path), user_dataset(dtype=torch.float64)
    pruned = trainer._remove_unused_columns(dataset, description="training")
    assert mat._arrow_columns(pruned, pruned[0], "torch") is None  # not reproduced from Arrow: read formatted
    materialized = mat.materialize(trainer, dataset)
    assert materialized is not None and materialized.columns["x"].dtype == torch.float64
    assert materialized.columns["labels"].dtype == torch.float64  # the formatter casts every number
    assert_same_batches(materialized, trainer, dataset, BATCHES)


def test_a_decoding_feature_is_not_read_from_arrow(tmp_path):
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, (4, 4, 3), dtype=np.uint8) for _ in range(10)]
    dataset = datasets.Dataset.from_dict({"x": images, "labels": list(range(10))},
                                         features=datasets.Features({"x": datasets.Image(),
                                                                     "labels": datasets.Value("int64")}))
    dataset.set_format("torch")
    trainer = make_trainer(tmp_path)
    pruned = trainer._remove_unused_columns(dataset, description="training")
    assert mat._arrow_columns(pruned, pruned[0], "torch") is None  # Arrow holds PNG bytes, not pixels
    materialized = mat.materialize(trainer, dataset)  # decoded once by datasets: same pixels as per row
    assert materialized is not None and materialized.columns["x"].dtype == torch.uint8
    assert_same_batches(materialized, trainer, dataset, [[0, 9, 3]])


def test_ragged_and_unsupported_data_are_refused(tmp_path):
    trainer = make_trainer(tmp_path)
    ragged = datasets.Dataset.from_dict({"x": [[0.0] * 6, [1.0] * 5, [2.0] * 6], "labels": [0, 1, 2]})
    ragged.set_format("torch")
    assert mat.materialize(trainer, ragged) is None
    pruned = trainer._remove_unused_columns(ragged, description="training")
    assert mat._arrow_columns(pruned, pruned[0], "torch") is None
    with_null = datasets.Dataset.from_dict({"x": [[0.0] * 6, None, [2.0] * 6], "labels": [0, 1, 2]})
    with_null.set_format("torch")
    pruned = trainer._remove_unused_columns(with_null, description="training")
    assert mat._arrow_columns(pruned, pruned[0], "torch") is None
    assert mat.materialize(trainer, user_dataset(fmt=None)) is None  # python format: rows of lists
    transformed = user_dataset().with_transform(lambda batch: batch)
    assert mat.materialize(trainer, transformed) is None
    assert mat.materialize(trainer, user_dataset(), budget=0) is None
    # the budget counts bytes as stored: x float64 (Arrow's double), labels int64
    assert mat.materialize(trainer, user_dataset(), budget=23 * 6 * 8) is None  # x alone fills it
    assert mat.materialize(trainer, user_dataset(), budget=23 * (6 * 8 + 8)) is not None


def test_budget_environment_variable(monkeypatch):
    monkeypatch.setenv(mat.BUDGET_ENV, "2e6")
    assert mat.max_bytes() == 2_000_000
    monkeypatch.setenv(mat.BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match="give a number of bytes"):
        mat.max_bytes()
    monkeypatch.setenv(mat.BUDGET_ENV, "-1")
    with pytest.raises(ValueError, match="is negative"):
        mat.max_bytes()


@pytest.fixture(scope="module")
def user_data_bench():
    path = REPO_ROOT / "benchmarks" / "user_data.py"
    spec = importlib.util.spec_from_file_location("benchmarks_user_data", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize("fmt", ["torch", "numpy"])
def test_final_weights_equal_with_and_without_materialising_and_the_plain_loop(user_data_bench, fmt):
    b = user_data_bench
    setting = b.Setting(num_rounds=2, num_clients=12, clients_per_round=3)
    data = b.load(setting)
    plain = b.run_plain(setting, data)
    fast = b.run_trainer(setting, data, fmt, materialize=True)
    slow = b.run_trainer(setting, data, fmt, materialize=False)
    assert fast.round_steps == slow.round_steps == plain.round_steps and sum(plain.round_steps) > 0
    assert torch.equal(fast.final_params, slow.final_params)
    assert torch.equal(fast.final_params, plain.final_params)
    initial = torch.nn.utils.parameters_to_vector(b.fresh_model(setting).parameters()).detach()
    assert not torch.equal(plain.final_params, initial)  # it trained


def test_python_calls_per_round_are_counted_over_the_rounds_asked_and_repeat_exactly(user_data_bench):
    """The benchmark's call count (``count_python_calls``): the same code gives the same number, rounds 1..N only."""
    b = user_data_bench
    setting = b.Setting(num_rounds=4, num_clients=12, clients_per_round=3)
    data = b.load(setting)
    plain = [b.count_python_calls(lambda gate: b.run_plain(setting, data, gate), rounds) for rounds in (2, 2, 3)]
    assert plain[0] == plain[1] > 0  # (per round: rounds 1-2 twice)
    assert plain[2] != plain[0]  # rounds 1-3: another client sample, another count
    library = b.count_python_calls(lambda gate: b.run_trainer(setting, data, "torch", True, gate), 2)
    assert library > 0 and library != plain[0]  # (another loop, another count: fewer or more)
    assert sys.getprofile() is None  # the counter is off again


def test_tensor_ops_per_round_are_counted_over_the_rounds_asked_and_repeat_exactly(user_data_bench):
    """The benchmark's tensor-operation count (``count_tensor_ops``): the same code gives the same number, rounds 1..N
    only, and the mode is popped again."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    b = user_data_bench
    setting = b.Setting(num_rounds=4, num_clients=12, clients_per_round=3)
    data = b.load(setting)
    plain = [b.count_tensor_ops(lambda gate: b.run_plain(setting, data, gate), rounds) for rounds in (2, 2, 3)]
    assert plain[0] == plain[1] > 0
    assert plain[2] != plain[0]
    library = b.count_tensor_ops(lambda gate: b.run_trainer(setting, data, "torch", True, gate), 2)
    assert library > 0 and library != plain[0]
    assert _get_current_dispatch_mode() is None
