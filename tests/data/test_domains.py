"""Multi-domain image datasets (``hf_fedflat.data.domains``) on generated folders: columns, labels, transforms,
leave-one-domain-out partitions, and a federated run on them."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from hf_fedflat.data import (
    ClientPartition,
    DomainPartition,
    leave_one_domain_out,
    load_domain_dataset,
    plot_partition_heatmap,
    without_transform,
)


DOMAINS = ["art", "clipart", "photo"]
CLASSES = ["bike", "cat", "dog", "mug"]
PER_CLASS = 3


def domain_color(d: int, c: int, i: int) -> tuple[int, int, int]:
    """A constant colour encoding (domain, class, image) so tests can read the origin back."""
    return (40 * d + 10, 50 * c + 5, 20 * i + 7)


@pytest.fixture(scope="module")
def domain_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("office") / "OfficeTiny"
    for d, domain in enumerate(DOMAINS):
        for c, name in enumerate(CLASSES):
            folder = root / domain / name
            folder.mkdir(parents=True)
            for i in range(PER_CLASS):
                Image.new("RGB", (8, 8), domain_color(d, c, i)).save(folder / f"{i:03d}.png")
    (root / "README.txt").write_text("files at the root are not domains")
    return root


@pytest.fixture(scope="module")
def domain_data(domain_folder):
    return load_domain_dataset(data_dir=domain_folder)


def origin(image) -> tuple[int, int, int]:
    """(domain, class, image) indices decoded from a generated constant-colour image."""
    r, g, b = np.asarray(image)[0, 0]
    return (int(r) - 10) // 40, (int(g) - 5) // 50, (int(b) - 7) // 20


def test_domain_folder_columns_labels_and_transform(domain_folder, domain_data):
    assert domain_data.num_rows == len(DOMAINS) * len(CLASSES) * PER_CLASS
    assert domain_data.features["domain"].names == DOMAINS
    assert domain_data.features["label"].names == CLASSES
    for row in domain_data:  # every row's stored domain/label is the folder it came from
        d, c, _ = origin(row["image"])
        assert (row["domain"], row["label"]) == (d, c)
    data = load_domain_dataset(data_dir=domain_folder, image_size=16)
    batch = data[:5]
    assert set(batch) == {"pixel_values", "labels"}
    assert batch["pixel_values"].shape == (5, 3, 16, 16) and batch["pixel_values"].dtype == torch.float32
    assert batch["labels"].dtype == torch.int64
    assert batch["labels"].tolist() == domain_data[:5]["label"]
    r, g, b = domain_color(0, 0, 0)  # row 0: art/bike/000, constant colour survives resizing
    expected = (torch.tensor([r, g, b]) / 255 - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor(
        [0.229, 0.224, 0.225]
    )
    torch.testing.assert_close(batch["pixel_values"][0, :, 5, 9], expected, rtol=0, atol=1e-5)


def test_class_indices_are_shared_by_domains_missing_a_class(tmp_path):
    # Domain "a" lacks class "ant": indexing classes per domain would give "bee" index 0 there.
    for domain, classes in (("a", ["bee", "cow"]), ("b", ["ant", "bee", "cow"])):
        for name in classes:
            (tmp_path / domain / name).mkdir(parents=True)
            Image.new("L", (4, 4), 7).save(tmp_path / domain / name / "x.jpg")
    data = load_domain_dataset(data_dir=tmp_path)
    names = data.features["label"].names
    assert names == ["ant", "bee", "cow"]
    rows = [(data.features["domain"].int2str(r["domain"]), names[r["label"]]) for r in without_transform(data)]
    assert sorted(rows) == [("a", "bee"), ("a", "cow"), ("b", "ant"), ("b", "bee"), ("b", "cow")]


def check_domain_partition(train, test, part, held_out, m):
    n_train = (len(DOMAINS) - 1) * len(CLASSES) * PER_CLASS
    assert isinstance(part, ClientPartition) and isinstance(part, DomainPartition)
    assert (train.num_rows, test.num_rows) == (n_train, len(CLASSES) * PER_CLASS)
    assert set(test["domain"]) == {DOMAINS.index(held_out)}  # the test set is the held-out domain
    assert part.num_clients == m * (len(DOMAINS) - 1) and part.num_rows == n_train
    every = np.sort(np.concatenate(part.client_indices))
    np.testing.assert_array_equal(every, np.arange(n_train))  # each training row exactly once
    train_domains = np.asarray(train["domain"])
    expected_order = [d for d in DOMAINS if d != held_out for _ in range(m)]
    assert part.client_domains == expected_order  # grouped by domain
    for client in range(part.num_clients):
        held = {DOMAINS[i] for i in train_domains[part.client_indices[client]]}
        assert held == {part.client_domain(client)}  # a single domain, never the held-out one
        client_rows = part.client_dataset(train, client)
        np.testing.assert_array_equal(
            np.bincount(client_rows["label"], minlength=len(CLASSES)), part.label_counts[client]
        )
    assert part.domain_clients(held_out) == []
    sizes = part.num_samples
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n_train


@pytest.mark.parametrize("held_out", DOMAINS)
def test_leave_one_domain_out_one_client_per_domain(domain_data, held_out):
    train, test, part = leave_one_domain_out(domain_data, held_out)
    check_domain_partition(train, test, part, held_out, 1)
    assert part.label_counts.tolist() == [[PER_CLASS] * len(CLASSES)] * 2  # whole domains


@pytest.mark.parametrize("m", [2, 5])
def test_leave_one_domain_out_m_clients_per_domain(domain_data, m):
    train, test, part = leave_one_domain_out(domain_data, "photo", clients_per_domain=m, seed=3)
    check_domain_partition(train, test, part, "photo", m)
    again = leave_one_domain_out(domain_data, "photo", clients_per_domain=m, seed=3)[2]
    other = leave_one_domain_out(domain_data, "photo", clients_per_domain=m, seed=4)[2]
    assert again == part and other != part
    assert "clients_per_domain" in part.summary()


def test_domain_partition_json_round_trip_and_heatmap(domain_data, tmp_path):
    part = leave_one_domain_out(domain_data, "art", clients_per_domain=2)[2]
    path = part.save_json(tmp_path / "partition.json")
    back = DomainPartition.load_json(path)
    assert back == part and back.client_domains == part.client_domains
    assert json.loads(path.read_text())["held_out_domain"] == "art"
    assert plot_partition_heatmap(part, tmp_path / "heat.png").stat().st_size > 1000


def test_unknown_held_out_domain_and_bad_client_count(domain_data):
    with pytest.raises(ValueError, match=r"held_out_domain='sketch'.*\['art', 'clipart', 'photo'\]"):
        leave_one_domain_out(domain_data, "sketch")
    with pytest.raises(ValueError, match="clients_per_domain=13 exceeds the 12 rows"):
        leave_one_domain_out(domain_data, "art", clients_per_domain=13)
    with pytest.raises(ValueError, match="clients_per_domain"):
        leave_one_domain_out(domain_data, "art", clients_per_domain=0)


def test_domain_dataset_with_other_column_names(tmp_path):
    """DomainNet-like copy: string domains and labels under other names, saved to disk."""
    rng = np.random.default_rng(0)
    rows = {
        "picture": [rng.integers(0, 255, (6, 6, 3), dtype=np.uint8) for _ in range(6)],
        "dom": ["sketch", "real", "sketch", "real", "quickdraw", "real"],
        "y": ["zebra", "apple", "apple", "zebra", "zebra", "apple"],
    }
    features = datasets.Features(picture=datasets.Image(), dom=datasets.Value("string"), y=datasets.Value("string"))
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(tmp_path / "saved")
    with pytest.raises(ValueError, match="domain_column='domain' is not a column"):
        load_domain_dataset(data_dir=tmp_path / "saved")
    data = load_domain_dataset(
        data_dir=tmp_path / "saved", image_column="picture", domain_column="dom", label_column="y",
    )
    assert data.features["domain"].names == ["quickdraw", "real", "sketch"]
    assert data.features["label"].names == ["apple", "zebra"]
    assert data["label"] == [1, 0, 0, 1, 1, 0] and data["domain"] == [2, 1, 2, 1, 0, 1]
    train, test, part = leave_one_domain_out(data, "quickdraw")
    assert test.num_rows == 1 and part.client_domains == ["real", "sketch"]
    assert part.num_samples == [3, 2]


def test_domain_partition_trains_in_federated_trainer(domain_folder, tmp_path):
    from hf_fedflat import FedTrainingArguments, FederatedTrainer
    from hf_fedflat.models import create_model

    data = load_domain_dataset(data_dir=domain_folder, image_size=16)
    train, test, part = leave_one_domain_out(data, "clipart", clients_per_domain=2)
    args = FedTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, num_clients=part.num_clients, clients_per_round=2,
        num_rounds=1, local_steps=1, per_device_train_batch_size=4, learning_rate=0.01, seed=0,
    )
    torch.manual_seed(0)
    model = create_model("small_cnn", num_classes=len(CLASSES), in_chans=3, image_size=16)
    output = FederatedTrainer(model, args, train, test, partition=part).train()
    assert len(output.history) == 1 and np.isfinite(output.history[0]["eval_loss"])
    saved = json.loads((tmp_path / "partition.json").read_text())
    assert saved["client_domains"] == ["art", "art", "photo", "photo"]
