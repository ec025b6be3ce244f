"""scikit-learn's handwritten digits as a ``datasets.DatasetDict`` (offline, 1,797 images).

``sklearn.datasets.load_digits`` ships inside scikit-learn: 1,797 real 8x8 grayscale
digits (UCI optdigits test set, pixel values 0..16, about 180 per class). It needs no
download, which makes it the dataset of choice for tests and quick examples.
"""

from __future__ import annotations

import datasets
import numpy as np

from hf_fedflat.data.transforms import image_classification_transform
from ..field_checks import ConfigError
from .arguments import DEFAULT_SPLIT_SEED

__all__ = [
    "DIGITS_CLASS_NAMES",
    "DIGITS_MEAN",
    "DIGITS_NUM_ROWS",
    "DIGITS_STD",
    "digits_features",
    "load_digits_dataset",
]

DIGITS_NUM_ROWS = 1797
DIGITS_CLASS_NAMES = [str(i) for i in range(10)]
# Mean and std of all 1,797 stored images (8x8 pixels scaled to [0, 1]).
DIGITS_MEAN = 0.3053
DIGITS_STD = 0.3760


def digits_features() -> datasets.Features:
    """Stored features: ``image`` (8x8 float32 in [0, 1]) and ``label`` (ClassLabel "0".."9")."""
    return datasets.Features(
        {
            "image": datasets.Array2D(shape=(8, 8), dtype="float32"),
            "label": datasets.ClassLabel(names=DIGITS_CLASS_NAMES),
        }
    )


def load_digits_dataset(
    image_size: int = 32,
    test_fraction: float = 0.2,
    seed: int = DEFAULT_SPLIT_SEED,
    *,
    apply_transform: bool = True,
) -> datasets.DatasetDict:
    """Load scikit-learn's digits as a stratified train/test ``DatasetDict``.

    The split is stratified by label (``sklearn.model_selection.train_test_split`` with
    ``stratify``), so both splits keep the ~10% share of each digit; the same ``seed``
    gives the same split, and the default is the command line's (``DEFAULT_SPLIT_SEED``, 42). The test split has ``ceil(test_fraction * 1797)`` rows
    (360 for the default 0.2, leaving 1,437 for training).

    Stored columns (what :func:`~hf_fedflat.data.transforms.without_transform`, the
    partitioner and ``apply_transform=False`` see):

    * ``image``: ``Array2D((8, 8), "float32")``, pixel values divided by 16, in [0, 1];
    * ``label``: ``ClassLabel(names=["0", ..., "9"])``.

    With ``apply_transform=True`` (default) both splits carry a batch transform
    (:func:`~hf_fedflat.data.transforms.image_classification_transform`) that returns
    ``pixel_values`` (float32 ``[1, image_size, image_size]`` per row, bilinear upscaling,
    normalised with :data:`DIGITS_MEAN`/:data:`DIGITS_STD`) and ``labels`` (int64).
    Train with ``TrainingArguments(remove_unused_columns=False)``: the transformed
    columns are not stored columns, and the ``Trainer`` would otherwise drop
    ``image``/``label`` before the transform runs. ``Dataset.select`` (used for client
    subsets) keeps the transform.

    Args:
        image_size: side of the square ``pixel_values`` (bilinear upscaling from 8x8).
        test_fraction: share of the rows held out for ``test``, in (0, 1).
        seed: seed of the stratified split.
        apply_transform: set the transform on both splits (default) or return the raw
            stored columns.

    Returns:
        ``DatasetDict`` with splits ``"train"`` and ``"test"``.

    Raises:
        ValueError: if ``test_fraction`` is not in (0, 1) or ``image_size`` < 1.

    Example:
        >>> dd = load_digits_dataset(image_size=32)
        >>> batch = dd["train"][:4]
        >>> tuple(batch["pixel_values"].shape), batch["labels"].dtype
        ((4, 1, 32, 32), torch.int64)
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < float(test_fraction) < 1.0:
        raise ConfigError(
            f"test_fraction must be in (0, 1) (share of rows held out), got {test_fraction}"
        )
    if int(image_size) < 1:
        raise ConfigError(f"image_size must be a positive int, got {image_size}")

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # [1797, 8, 8], values 0..16
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)),
        test_size=float(test_fraction),
        stratify=labels,
        random_state=seed,
        shuffle=True,
    )
    features = digits_features()
    info = datasets.DatasetInfo(
        description=(
            "scikit-learn load_digits: 1,797 8x8 handwritten digits (UCI optdigits), "
            "pixels scaled to [0, 1]; stratified split with seed "
            f"{seed}, test_fraction {test_fraction}."
        ),
        homepage="https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits",
        license="CC BY 4.0",
        features=features,
    )
    splits = {
        name: datasets.Dataset.from_dict(
            {"image": images[idx], "label": labels[idx]}, features=features, info=info,
            split=name,
        )
        for name, idx in (("train", train_idx), ("test", test_idx))
    }
    dataset_dict = datasets.DatasetDict(splits)
    if apply_transform:
        dataset_dict = dataset_dict.with_transform(
            image_classification_transform(image_size, mean=DIGITS_MEAN, std=DIGITS_STD)
        )
    return dataset_dict
