"""Data: offline datasets, on-the-fly transforms and federated partitioning."""

from hf_fedflat.data.digits import (
    DIGITS_CLASS_NAMES,
    DIGITS_MEAN,
    DIGITS_NUM_ROWS,
    DIGITS_STD,
    digits_features,
    load_digits_dataset,
)
from hf_fedflat.data.partition import (
    SCHEMES,
    ClientPartition,
    partition_dataset,
    plot_partition_heatmap,
)
from hf_fedflat.data.transforms import (
    image_classification_transform,
    to_image_tensor,
    without_transform,
)

__all__ = [
    "DIGITS_CLASS_NAMES",
    "DIGITS_MEAN",
    "DIGITS_NUM_ROWS",
    "DIGITS_STD",
    "SCHEMES",
    "ClientPartition",
    "digits_features",
    "image_classification_transform",
    "load_digits_dataset",
    "partition_dataset",
    "plot_partition_heatmap",
    "to_image_tensor",
    "without_transform",
]
