"""Partition invariants on the real digits train split (1,437 rows, 10 classes); natural-id partitions and the
schemes that need no label column, on small hand-made datasets."""

from __future__ import annotations

import json
import warnings

import datasets
import numpy as np
import pytest

from hf_fedflat.data import (
    SCHEMES,
    ClientPartition,
    load_digits_dataset,
    partition_dataset,
    plot_partition_heatmap,
    select_rows,
)
from hf_fedflat.data.partition import natural_id_partition

NUM_CLIENTS = 20
N_TRAIN = 1437


@pytest.fixture(scope="module")
def digits():
    return load_digits_dataset(image_size=32, apply_transform=False)


@pytest.fixture(scope="module")
def train(digits):
    return digits["train"]


@pytest.fixture(scope="module")
def labels(train):
    return np.asarray(train["label"], dtype=np.int64)


@pytest.fixture(scope="module")
def partitions(train):
    return {s: partition_dataset(train, NUM_CLIENTS, s, seed=0) for s in SCHEMES}


def _mean_tv_to_global(part: ClientPartition) -> float:
    """Mean total-variation distance between each client's label mix and the global one."""
    counts = part.label_counts.astype(float)
    glob = counts.sum(0) / counts.sum()
    local = counts / counts.sum(1, keepdims=True)
    return float(0.5 * np.abs(local - glob).sum(1).mean())


def _rows_equal(a, b) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a
    )


@pytest.mark.parametrize("formatting", ["transform", "torch_columns", "numpy_all_columns", "none", "after_select"])
@pytest.mark.parametrize("indices", [[5, 0, 17, 3], [4, 5, 6], []], ids=["scattered", "contiguous", "empty"])
def test_select_rows_equals_select(train, formatting, indices):
    dataset = {
        "transform": lambda: load_digits_dataset(image_size=16)["train"],
        "torch_columns": lambda: train.with_format("torch", columns=["label", "image"]),
        "numpy_all_columns": lambda: train.with_format("numpy", columns=["label"], output_all_columns=True),
        "none": lambda: train,
        "after_select": lambda: load_digits_dataset(image_size=16)["train"].select(range(900, 1000)),
    }[formatting]()
    parent_format, parent_fingerprint = dataset.format, dataset._fingerprint
    expected, subset = dataset.select(indices), select_rows(dataset, indices)
    assert subset.format == expected.format and len(subset) == len(expected) == len(indices)
    assert _rows_equal(subset[:], expected[:])
    if indices:
        assert _rows_equal(subset[1], expected[1])
    # the subset's fingerprint depends on the parent and the rows; the parent is untouched
    assert select_rows(dataset, indices)._fingerprint == subset._fingerprint
    assert select_rows(dataset, [1, 2])._fingerprint != select_rows(dataset, [1, 3])._fingerprint
    assert dataset.format == parent_format and dataset._fingerprint == parent_fingerprint


def test_select_rows_follows_in_place_format_changes(train):
    dataset = train.select(range(50))
    before = select_rows(dataset, [1, 2])
    dataset.set_format("numpy", columns=["label"])  # in place: a new fingerprint, a new twin
    after = select_rows(dataset, [1, 2])
    assert before.format["type"] is None and after.format == dataset.select([1, 2]).format
    assert isinstance(after[:]["label"], np.ndarray) and set(after[:]) == {"label"}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_disjoint_complete_sorted(partitions, scheme):
    part = partitions[scheme]
    assert part.num_clients == NUM_CLIENTS
    assert part.scheme == scheme and part.num_rows == N_TRAIN
    for idx in part.client_indices:
        assert idx.dtype == np.int64
        assert np.all(np.diff(idx) > 0)  # sorted, no repeats
    all_rows = np.concatenate(part.client_indices)
    assert len(np.unique(all_rows)) == len(all_rows)  # disjoint
    # All four schemes use every row here (pathological: first-deterministic class
    # assignment with 20 clients >= 10 classes uses every class).
    np.testing.assert_array_equal(np.sort(all_rows), np.arange(N_TRAIN))
    assert sum(part.num_samples) == N_TRAIN
    assert min(part.num_samples) >= 2  # default min_partition_size


@pytest.mark.parametrize("scheme", SCHEMES)
def test_label_counts_match_recount(partitions, labels, scheme):
    part = partitions[scheme]
    recount = np.stack([np.bincount(labels[idx], minlength=10) for idx in part.client_indices])
    assert part.label_counts.dtype == np.int64
    np.testing.assert_array_equal(part.label_counts, recount)
    assert part.class_names == [str(i) for i in range(10)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_seed_same_partition_other_seed_differs(train, partitions, scheme):
    again = partition_dataset(train, NUM_CLIENTS, scheme, seed=0)
    assert again == partitions[scheme]
    other = partition_dataset(train, NUM_CLIENTS, scheme, seed=1)
    assert other != partitions[scheme]
    assert not all(
        np.array_equal(a, b) for a, b in zip(other.client_indices, again.client_indices)
    )


def test_iid_is_shuffled_and_balanced(partitions):
    part = partitions["iid"]
    # flwr's IidPartitioner is a contiguous shard; we shuffle rows first.
    assert not np.array_equal(part.client_indices[0], np.arange(72))
    assert sorted(part.num_samples) == [71] * 3 + [72] * 17
    assert _mean_tv_to_global(part) < 0.2
    assert (part.label_counts > 0).sum(1).min() >= 8


def test_dirichlet_is_skewed_and_alpha_controls_it(train, partitions):
    skewed = _mean_tv_to_global(partitions["dirichlet"])
    near_iid = _mean_tv_to_global(partition_dataset(train, NUM_CLIENTS, "dirichlet", alpha=1000.0))
    assert skewed > 0.35
    assert near_iid < 0.2
    assert partitions["dirichlet"].alpha == 0.3
    assert len(set(partitions["dirichlet"].num_samples)) > 5  # sizes vary


def test_dirichlet_honours_min_partition_size(train, caplog):
    # seed 1: the first two Dirichlet draws leave a client below 20 rows; flwr redraws.
    caplog.set_level("INFO", logger="hf_fedflat.data.partition")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # flwr's per-redraw warnings are absorbed
        part = partition_dataset(train, NUM_CLIENTS, "dirichlet", alpha=0.3,
                                 min_partition_size=20, seed=1)
    assert "redrew 2 time(s)" in caplog.text
    assert min(part.num_samples) == 20
    assert sum(part.num_samples) == N_TRAIN


def test_dirichlet_unreachable_min_size_raises(train):
    with pytest.raises(ValueError, match="min_partition_size"):
        partition_dataset(train, 200, "dirichlet", alpha=0.05, min_partition_size=5)


def test_inner_dirichlet_tiny_alpha_raises_clear_error(train):
    # flwr fails with "Probabilities contain NaN" once a client's favoured classes run out
    with pytest.raises(ValueError, match="raise alpha"):
        partition_dataset(train, NUM_CLIENTS, "inner_dirichlet", alpha=0.001, seed=0)


def test_pathological_infeasible_raises(train):
    # 1,437 clients x 2 classes needs ~290 shards of a class that has ~142 rows
    with pytest.raises(ValueError, match="classes_per_client"):
        partition_dataset(train, N_TRAIN, "pathological", min_partition_size=0)


def test_inner_dirichlet_equal_sizes(partitions):
    part = partitions["inner_dirichlet"]
    # 1437 = 20 * 71 + 17: seventeen clients of 72, three of 71.
    assert part.num_samples == [72] * 17 + [71] * 3
    assert _mean_tv_to_global(part) > 0.35


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_classes_per_client(train, k):
    part = partition_dataset(train, NUM_CLIENTS, "pathological", classes_per_client=k, seed=0)
    present = part.label_counts > 0
    np.testing.assert_array_equal(present.sum(1), np.full(NUM_CLIENTS, k))
    # first-deterministic assignment: client i always holds class i % 10
    assert all(present[i, i % 10] for i in range(NUM_CLIENTS))
    assert part.classes_per_client == k and part.alpha is None
    assert sum(part.num_samples) == N_TRAIN


def test_pathological_with_fewer_clients_than_classes_drops_rows(train, labels):
    # 4 clients x 1 class: only classes 0..3 are used, the other rows are left out.
    with pytest.warns(UserWarning, match="will NOT be used"):
        part = partition_dataset(train, 4, "pathological", classes_per_client=1)
    for i, idx in enumerate(part.client_indices):
        assert set(labels[idx]) == {i}
        assert len(idx) == int((labels == i).sum())
    assert sum(part.num_samples) == int(np.isin(labels, [0, 1, 2, 3]).sum()) < N_TRAIN


def test_client_dataset_keeps_transform(digits, train, labels, partitions):
    transformed = load_digits_dataset(image_size=32)["train"]
    part = partitions["dirichlet"]
    client = part.client_dataset(transformed, 3)
    assert len(client) == part.num_samples[3]
    batch = client[:5]
    assert tuple(batch["pixel_values"].shape) == (5, 1, 32, 32)
    np.testing.assert_array_equal(batch["labels"].numpy(), labels[part.client_indices[3][:5]])
    # partitioning the transformed dataset reads labels without the transform: same result
    assert partition_dataset(transformed, NUM_CLIENTS, "dirichlet", seed=0) == part
    with pytest.raises(ValueError, match="rows"):
        part.client_dataset(digits["test"], 0)
    with pytest.raises(IndexError):
        part.client_dataset(train, NUM_CLIENTS)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_json_round_trip(partitions, tmp_path, scheme):
    part = partitions[scheme]
    d = json.loads(json.dumps(part.to_dict()))
    back = ClientPartition.from_dict(d)
    assert back == part
    assert back.num_samples == part.num_samples
    assert ClientPartition.load_json(part.save_json(tmp_path / "p.json")) == part


def test_summary_numbers(partitions):
    text = partitions["inner_dirichlet"].summary()
    assert "inner_dirichlet(alpha=0.3), seed 0: 20 clients, 1437 samples, 10 classes" in text
    assert "samples per client: min 71 / median 72 / max 72" in text
    assert "classes per client: min 2 / median 2 / max 2" in partitions["pathological"].summary()


@pytest.mark.parametrize("num_clients", [NUM_CLIENTS, 60])
def test_heatmap_png(train, tmp_path, num_clients):
    part = partition_dataset(train, num_clients, "dirichlet", min_partition_size=1)
    out = plot_partition_heatmap(part, tmp_path / "sub" / "heat.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_non_classlabel_labels_are_encoded():
    # string labels, and integer labels with gaps (InnerDirichletPartitioner alone would
    # assume labels 0..K-1)
    ds = datasets.Dataset.from_dict({"y": ["b", "a", "c"] * 20})
    part = partition_dataset(ds, 3, "iid", label_column="y", min_partition_size=1)
    assert part.class_names == ["a", "b", "c"] and part.label_counts.sum() == 60
    gaps = datasets.Dataset.from_dict({"label": [0, 5, 7, 7] * 25})
    part = partition_dataset(gaps, 4, "inner_dirichlet", alpha=1.0)
    assert part.class_names == ["0", "5", "7"]
    assert part.num_samples == [25] * 4
    np.testing.assert_array_equal(part.label_counts.sum(0), [25, 25, 50])


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(scheme="shards"), "scheme"),
        (dict(scheme="dirichlet", alpha=0.0), "alpha"),
        (dict(scheme="inner_dirichlet", alpha=-1.0), "alpha"),
        (dict(num_clients=0), "num_clients"),
        (dict(num_clients=N_TRAIN + 1), "num_clients"),
        (dict(scheme="pathological", classes_per_client=0), "classes_per_client"),
        (dict(scheme="pathological", classes_per_client=11), "classes_per_client"),
        (dict(label_column="target"), "label_column"),
        (dict(num_clients=100, min_partition_size=15), "min_partition_size"),
        (dict(scheme="iid", num_clients=100, min_partition_size=15), "min_partition_size"),
    ],
)
def test_bad_arguments(train, kwargs, name):
    kwargs = {"num_clients": NUM_CLIENTS, **kwargs}
    with pytest.raises(ValueError, match=name):
        partition_dataset(train, **kwargs)


def test_datasetdict_is_refused(digits):
    with pytest.raises(TypeError, match=r"dataset\['train'\]"):
        partition_dataset(digits, NUM_CLIENTS)


# --- natural ids, and datasets without a label column -------------------------------------------------
def test_natural_id_partition_one_client_per_id_complete_disjoint():
    ids = ["b", "a", "b", "c", "a", "a", "d", "c"]
    data = datasets.Dataset.from_dict({"user": ids, "label": [0, 1, 1, 0, 0, 1, 1, 0]})
    part = natural_id_partition(data, "user")
    assert part.num_clients == 4 and part.scheme == "natural_id"
    groups = sorted(tuple(idx.tolist()) for idx in part.client_indices)
    assert groups == [(0, 2), (1, 4, 5), (3, 7), (6,)]
    # label counts per client, and the classes read from the label column
    by_rows = {tuple(idx.tolist()): part.label_counts[c].tolist() for c, idx in enumerate(part.client_indices)}
    assert by_rows[(1, 4, 5)] == [1, 2] and by_rows[(6,)] == [0, 1]
    with pytest.raises(ValueError, match="partition_by: 'speaker' is not a column"):
        natural_id_partition(data, "speaker")
    with pytest.raises(ValueError, match="missing"):
        natural_id_partition(datasets.Dataset.from_dict({"user": ["a", None]}), "user")


@pytest.mark.parametrize("columns", [{"text": [f"t{i}" for i in range(23)]},
                                     {"input_ids": [[1, 2, i] for i in range(23)],
                                      "labels": [[-100, 2, i] for i in range(23)]}], ids=["no-label", "token-labels"])
@pytest.mark.parametrize("scheme", ["iid", "linear"])
def test_iid_and_size_partitions_need_no_label_column(columns, scheme):
    data = datasets.Dataset.from_dict(columns)
    part = partition_dataset(data, 4, scheme, label_column="labels" if "labels" in columns else "label", seed=3)
    rows = np.concatenate(part.client_indices)
    np.testing.assert_array_equal(np.sort(rows), np.arange(23))  # complete and disjoint
    assert part.class_names == ["all"] and part.label_counts[:, 0].tolist() == part.num_samples
    if scheme == "iid":
        assert sorted(part.num_samples) == [5, 6, 6, 6]
    else:  # flwr's LinearPartitioner: floor(23 * k / 10) for k = 1..4, the 2 rows left over to the last client
        assert part.num_samples == [2, 4, 6, 9 + 2]
