"""CIFAR-10 / CIFAR-100 (``hf_fedflat.data.cifar``) from generated ``save_to_disk`` and image folders: labels,
normalisation, train augmentation, partitions of CIFAR-100's fine labels, a timm data config."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from hf_fedflat.data import load_cifar, partition_dataset, without_transform
from hf_fedflat.data.cifar import CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD

from helpers.images import TIMM_CONFIG


def constant_cifar_dict(num_classes: int, label_column: str, n_per_split: int = 6) -> datasets.DatasetDict:
    names = [f"class_{i}" for i in range(num_classes)]
    features = {"img": datasets.Image(), label_column: datasets.ClassLabel(names=names)}
    if label_column == "fine_label":
        features["coarse_label"] = datasets.ClassLabel(names=["a", "b"])
    splits = {}
    for s, split in enumerate(("train", "test")):
        values = [(3 * i + s * 100) % 256 for i in range(n_per_split)]
        rows = {
            "img": [np.full((32, 32, 3), v, dtype=np.uint8) for v in values],
            label_column: [(7 * i + s) % num_classes for i in range(n_per_split)],
        }
        if label_column == "fine_label":
            rows["coarse_label"] = [i % 2 for i in range(n_per_split)]
        splits[split] = datasets.Dataset.from_dict(rows, features=datasets.Features(features))
    return datasets.DatasetDict(splits)


@pytest.mark.parametrize(
    "num_classes,label_column,mean,std",
    [(10, "label", CIFAR10_MEAN, CIFAR10_STD), (100, "fine_label", CIFAR100_MEAN, CIFAR100_STD)],
)
def test_cifar_from_save_to_disk(tmp_path, num_classes, label_column, mean, std):
    raw = constant_cifar_dict(num_classes, label_column)
    raw.save_to_disk(tmp_path / "cifar")
    data = load_cifar(data_dir=tmp_path / "cifar")
    assert set(data) == {"train", "test"}
    stored = without_transform(data)["train"]
    assert stored.features["label"].num_classes == num_classes
    assert stored["label"] == raw["train"][label_column]
    assert ("coarse_label" in stored.column_names) == (label_column == "fine_label")
    batch = data["test"][:6]
    assert batch["pixel_values"].shape == (6, 3, 32, 32)
    assert batch["labels"].tolist() == raw["test"][label_column]
    values = torch.tensor([(3 * i + 100) % 256 for i in range(6)], dtype=torch.float32) / 255
    expected = (values.view(6, 1) - torch.tensor(mean)) / torch.tensor(std)  # [6, 3]
    torch.testing.assert_close(batch["pixel_values"][:, :, 11, 20], expected, rtol=0, atol=1e-6)
    resized = load_cifar(data_dir=tmp_path / "cifar", image_size=40)["train"][:2]["pixel_values"]
    assert resized.shape == (2, 3, 40, 40)


def test_cifar_from_image_folder_with_train_augmentation(tmp_path):
    rng = np.random.default_rng(0)
    stored = {}
    for split in ("train", "test"):
        for name in ("truck", "airplane", "cat"):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(2):
                array = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(array).save(tmp_path / "data" / split / name / f"{i}.png")
                stored[(split, name, i)] = array
    data = load_cifar(data_dir=tmp_path / "data", train_augmentation=True, cache_dir=tmp_path / "cache")
    raw = without_transform(data)
    assert raw["train"].features["label"].names == ["airplane", "cat", "truck"]
    assert (raw["train"].num_rows, raw["test"].num_rows) == (6, 6)
    mean, std = torch.tensor(CIFAR10_MEAN).view(3, 1, 1), torch.tensor(CIFAR10_STD).view(3, 1, 1)
    test = data["test"][:6]
    for k in range(6):  # the test split is deterministic: exactly the normalised stored image
        image = np.array(raw["test"][k]["image"])
        expected = (torch.from_numpy(image).permute(2, 0, 1).float() / 255 - mean) / std
        torch.testing.assert_close(test["pixel_values"][k], expected, rtol=0, atol=1e-6)
    torch.manual_seed(0)
    first = data["train"][:6]["pixel_values"]
    second = data["train"][:6]["pixel_values"]
    assert first.shape == (6, 3, 32, 32) and not torch.equal(first, second)  # random crop/flip


def test_partition_schemes_on_cifar_like_fine_label(tmp_path):
    num_classes, per_class = 20, 10
    labels = np.repeat(np.arange(num_classes), per_class)
    features = datasets.Features(
        img=datasets.Image(), fine_label=datasets.ClassLabel(num_classes=num_classes),
        coarse_label=datasets.ClassLabel(num_classes=2),
    )
    train = datasets.Dataset.from_dict(
        {"img": [np.zeros((4, 4, 3), np.uint8)] * labels.size, "fine_label": labels, "coarse_label": labels % 2},
        features=features,
    )
    expected = np.bincount(labels, minlength=num_classes)
    for scheme, kwargs in (
        ("dirichlet", dict(alpha=0.3)),
        ("inner_dirichlet", dict(alpha=0.3)),
        ("pathological", dict(classes_per_client=2)),
    ):
        num_clients = 20 if scheme == "pathological" else 10  # >= num_classes: every class is used
        part = partition_dataset(train, num_clients, scheme, label_column="fine_label", seed=1, **kwargs)
        every = np.sort(np.concatenate(part.client_indices))
        np.testing.assert_array_equal(every, np.arange(labels.size))
        np.testing.assert_array_equal(part.label_counts.sum(axis=0), expected)
        if scheme == "inner_dirichlet":
            assert part.num_samples == [20] * 10
        if scheme == "pathological":
            assert all(len(part.client_classes(i)) == 2 for i in range(num_clients))
    # After load_cifar renames fine_label -> label, the default label column gives the same split.
    datasets.DatasetDict(train=train, test=train.select(range(5))).save_to_disk(tmp_path / "c100")
    loaded = load_cifar(data_dir=tmp_path / "c100")["train"]
    assert partition_dataset(loaded, 10, "dirichlet", alpha=0.3, seed=1) == partition_dataset(
        train, 10, "dirichlet", alpha=0.3, seed=1, label_column="fine_label"
    )


def test_cifar_with_data_config(tmp_path):
    constant_cifar_dict(10, "label").save_to_disk(tmp_path / "cifar")
    data = load_cifar(data_dir=tmp_path / "cifar", data_config=TIMM_CONFIG, train_augmentation=True)
    assert data["train"][:3]["pixel_values"].shape == (3, 3, 20, 20)
    out = data["test"][:1]["pixel_values"][0]
    value = 100 / 255  # test row 0 is the constant 100
    expected = (value - torch.tensor(TIMM_CONFIG["mean"])) / torch.tensor(TIMM_CONFIG["std"])
    torch.testing.assert_close(out[:, 10, 10], expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="image_size and data_config"):
        load_cifar(data_dir=tmp_path / "cifar", data_config=TIMM_CONFIG, image_size=20)
