"""The offline digits dataset and its batch transform."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from hf_fedflat.data import (
    DIGITS_MEAN,
    DIGITS_STD,
    image_classification_transform,
    load_digits_dataset,
    to_image_tensor,
    without_transform,
)


@pytest.fixture(scope="module")
def dd():
    return load_digits_dataset(image_size=32, test_fraction=0.2, seed=0)


@pytest.fixture(scope="module")
def raw(dd):
    return without_transform(dd)


def test_sizes_and_features(raw):
    assert set(raw) == {"train", "test"}
    assert (raw["train"].num_rows, raw["test"].num_rows) == (1437, 360)
    assert raw["train"].num_rows + raw["test"].num_rows == 1797
    feats = raw["train"].features
    assert feats["label"].names == [str(i) for i in range(10)]
    assert feats["image"] == datasets.Array2D(shape=(8, 8), dtype="float32")
    images = np.asarray(raw["train"].with_format("numpy")["image"])
    assert images.shape == (1437, 8, 8) and images.dtype == np.float32
    assert images.min() == 0.0 and images.max() == 1.0


def test_stratified_and_complete(raw):
    total = np.bincount(load_digits().target, minlength=10)
    train = np.bincount(raw["train"]["label"], minlength=10)
    test = np.bincount(raw["test"]["label"], minlength=10)
    np.testing.assert_array_equal(train + test, total)
    assert np.all(np.abs(test - 0.2 * total) <= 1)  # every class ~20% held out
    # The union of both splits is exactly the sklearn image set (as a multiset).
    both = np.concatenate([
        np.asarray(raw[s].with_format("numpy")["image"]).reshape(-1, 64) for s in ("train", "test")
    ])
    ref = (load_digits().images / 16.0).astype(np.float32).reshape(-1, 64)
    np.testing.assert_array_equal(np.unique(both, axis=0), np.unique(ref, axis=0))
    assert len(both) == len(ref)


def test_split_depends_on_seed_only(raw):
    again = load_digits_dataset(seed=0, apply_transform=False)
    other = load_digits_dataset(seed=1, apply_transform=False)
    assert list(again["test"]["label"]) == list(raw["test"]["label"])
    assert list(other["test"]["label"]) != list(raw["test"]["label"])
    assert load_digits_dataset(test_fraction=0.5, apply_transform=False)["test"].num_rows == 899


def test_transform_batch_shape_dtype_values(dd, raw):
    batch = dd["train"][:16]
    assert set(batch) == {"pixel_values", "labels"}
    pv, y = batch["pixel_values"], batch["labels"]
    assert pv.shape == (16, 1, 32, 32) and pv.dtype == torch.float32
    assert y.dtype == torch.int64
    assert y.tolist() == list(raw["train"]["label"][:16])
    # Same numbers as upscaling and normalising the stored 8x8 images by hand.
    imgs = torch.from_numpy(np.asarray(raw["train"].with_format("numpy")["image"][:16]))
    ref = F.interpolate(imgs[:, None], size=(32, 32), mode="bilinear", align_corners=False)
    torch.testing.assert_close(pv, (ref - DIGITS_MEAN) / DIGITS_STD)
    # Normalisation constants fit the data: whole train set ~zero mean.
    full = dd["train"][:]["pixel_values"]
    assert abs(full.mean().item()) < 0.05 and 0.7 < full.std().item() < 1.0


def test_single_row_and_getitems(dd):
    row = dd["test"][0]
    assert row["pixel_values"].shape == (1, 32, 32) and row["labels"].dim() == 0
    items = dd["test"].__getitems__([3, 1, 2])  # what the Trainer's DataLoader calls
    assert len(items) == 3 and items[0]["pixel_values"].shape == (1, 32, 32)


def test_dataloader_one_interpolate_per_batch(dd, monkeypatch):
    calls = []
    real = F.interpolate

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "interpolate", counting)
    loader = torch.utils.data.DataLoader(dd["train"], batch_size=32)
    batch = next(iter(loader))
    assert batch["pixel_values"].shape == (32, 1, 32, 32)
    assert batch["labels"].shape == (32,) and batch["labels"].dtype == torch.int64
    assert calls == [torch.Size([32, 1, 8, 8])]


def test_other_image_size_and_select_keeps_transform():
    dd16 = load_digits_dataset(image_size=16)
    sub = dd16["train"].select([5, 7, 9])
    assert sub.format["type"] == "custom"
    assert sub[:]["pixel_values"].shape == (3, 1, 16, 16)


def test_without_transform_leaves_original(dd):
    raw_train = without_transform(dd["train"])
    assert set(raw_train[0]) == {"image", "label"}
    assert set(dd["train"][0]) == {"pixel_values", "labels"}


def test_to_image_tensor_layouts():
    hwc = np.full((2, 4, 4, 3), 255, dtype=np.uint8)
    t = to_image_tensor(list(hwc))
    assert t.shape == (2, 3, 4, 4) and torch.all(t == 1.0)  # uint8 scaled to [0, 1]
    with pytest.raises(ValueError, match="share a shape"):
        to_image_tensor([np.zeros((4, 4)), np.zeros((5, 5))])
    fn = image_classification_transform(8, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    out = fn({"image": list(hwc)})
    assert out["pixel_values"].shape == (2, 3, 8, 8) and "labels" not in out
    torch.testing.assert_close(out["pixel_values"], torch.ones(2, 3, 8, 8))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [(dict(test_fraction=0.0), "test_fraction"), (dict(test_fraction=1.5), "test_fraction"),
     (dict(image_size=0), "image_size")],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        load_digits_dataset(**kwargs)


def test_the_python_default_split_is_the_command_lines():
    """`load_digits_dataset()` splits with the seed `hf-fedflat train --dataset_name digits` uses (42), so a
    notebook and a run score on the same test rows."""
    from hf_fedflat.data.arguments import DEFAULT_SPLIT_SEED, DataArguments

    assert DataArguments().effective_split_seed == DEFAULT_SPLIT_SEED == 42
    default = load_digits_dataset(apply_transform=False)
    explicit = load_digits_dataset(seed=42, apply_transform=False)
    assert default["test"]["image"] == explicit["test"]["image"]
    assert default["test"]["image"] != load_digits_dataset(seed=0, apply_transform=False)["test"]["image"]
