"""Multi-domain image datasets (OfficeHome, DomainNet) and leave-one-domain-out clients.

Domain generalisation in federated form (FedLESAM, FedGH): every domain but one is training
data spread over clients; the held-out domain is the test set, never seen by any client.
Clients are either one per training domain (holding all of it) or ``M`` per domain (each domain
split at random into ``M`` near-equal parts; FedLESAM's OfficeHome/DomainNet runs sample 20% of
the clients per round). No library ships this split, so it is written here; the result is a
:class:`DomainPartition`, a :class:`~hf_fedflat.data.partition.ClientPartition` that also records
each client's domain, so ``FederatedTrainer(..., partition=part)`` trains on it directly::

    data = load_domain_dataset("flwrlabs/office-home", data_config=model)   # or data_dir=...
    train, test, part = leave_one_domain_out(data, "Art", clients_per_domain=10)
    args = FedTrainingArguments(..., num_clients=part.num_clients, participation_fraction=0.2)
    FederatedTrainer(model, args, train, test, partition=part).train()

Sources: a Hub copy (``flwrlabs/office-home``: columns ``image``, ``domain``, ``label``;
DomainNet copies name their columns differently, pass them as arguments), a ``save_to_disk``
folder, or the original image-folder layout ``<domain>/<class>/<image>`` (OfficeHome's
``Art/Alarm_Clock/00001.jpg``, DomainNet's ``clipart/aircraft_carrier/...``). Class indices are
shared by all domains: a class has the same ``label`` in every domain.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch

from hf_fedflat.data.images import (
    IMAGE_COLUMN,
    LABEL_COLUMN,
    class_ids,
    encode_class_column,
    find_image_column,
    hub_errors,
    hub_unavailable_error,
    image_transform,
    is_save_to_disk_folder,
    resolve_source,
    timm_transform,
)
from hf_fedflat.data.partition import ClientPartition
from ..field_checks import ConfigError

__all__ = [
    "DOMAIN_COLUMN",
    "IMAGE_EXTENSIONS",
    "OFFICE_HOME_HUB",
    "DomainPartition",
    "leave_one_domain_out",
    "load_domain_dataset",
]

logger = logging.getLogger(__name__)

DOMAIN_COLUMN = "domain"
OFFICE_HOME_HUB = "flwrlabs/office-home"
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
LEAVE_ONE_DOMAIN_OUT = "leave_one_domain_out"

# ImageNet statistics: the OfficeHome/DomainNet papers fine-tune ImageNet-pretrained models.
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


def _scan_domain_folder(root: Path) -> dict[str, list]:
    """Rows of ``<domain>/<class>/<image>``: image paths, domain names, class names."""
    rows: dict[str, list] = {IMAGE_COLUMN: [], DOMAIN_COLUMN: [], LABEL_COLUMN: []}
    for domain_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for class_dir in sorted(
            p for p in domain_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
        ):
            for image in sorted(class_dir.rglob("*")):
                if image.suffix.lower() in IMAGE_EXTENSIONS and not image.name.startswith("."):
                    rows[IMAGE_COLUMN].append(str(image))
                    rows[DOMAIN_COLUMN].append(domain_dir.name)
                    rows[LABEL_COLUMN].append(class_dir.name)
    if not rows[IMAGE_COLUMN]:
        raise ConfigError(
            f"data_dir={str(root)!r} holds no images in the layout <domain>/<class>/<image> "
            f"(extensions {sorted(IMAGE_EXTENSIONS)}); pass the folder whose subfolders are the "
            f"domains"
        )
    return rows


def _from_image_folder(root: Path) -> datasets.Dataset:
    rows = _scan_domain_folder(root)
    domains = sorted(set(rows[DOMAIN_COLUMN]))
    classes = sorted(set(rows[LABEL_COLUMN]))
    per_domain = {
        d: {c for c, dd in zip(rows[LABEL_COLUMN], rows[DOMAIN_COLUMN]) if dd == d} for d in domains
    }
    for d, present in per_domain.items():
        if len(present) != len(classes):
            logger.warning(
                "domain %r lacks %d of the %d classes (e.g. %s); class indices stay shared",
                d, len(classes) - len(present), len(classes), sorted(set(classes) - present)[:3],
            )
    features = datasets.Features({
        IMAGE_COLUMN: datasets.Image(),
        DOMAIN_COLUMN: datasets.ClassLabel(names=domains),
        LABEL_COLUMN: datasets.ClassLabel(names=classes),
    })
    return datasets.Dataset.from_dict(rows, features=features)


def load_domain_dataset(
    name_or_path: str = OFFICE_HOME_HUB,
    *,
    data_dir: str | os.PathLike | None = None,
    split: str | None = None,
    image_column: str | None = "image",
    domain_column: str = "domain",
    label_column: str = "label",
    image_size: int | tuple[int, int] | None = None,
    data_config: torch.nn.Module | Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.Dataset:
    """Load a multi-domain image dataset as one ``Dataset`` with a domain column.

    Stored columns after loading: ``image``, ``domain`` and ``label``, both ``ClassLabel`` with
    names sorted (the class names of an image folder are its class folder names, pooled over all
    domains so an index means the same class everywhere). Only the renamed/encoded columns are
    touched; images stay where they are (files or the Hub's Arrow cache) and are decoded lazily.

    With ``image_size`` or ``data_config`` the dataset carries a deterministic lazy transform
    (``pixel_values`` float32 ``[3, H, W]`` + ``labels``): plain resizing with ImageNet mean/std,
    or timm's preprocessing for the model. ``select`` keeps it, so the train and test sets of
    :func:`leave_one_domain_out` have it too.

    Args:
        name_or_path: Hub name (default ``"flwrlabs/office-home"``) or local folder.
        data_dir: local copy, ``<domain>/<class>/<image>`` or a ``save_to_disk`` folder; takes
            precedence over ``name_or_path``.
        split: split of a Hub/saved dataset to use; default: all splits concatenated (the domain
            split decides what is train and test).
        image_column, domain_column, label_column: the source's column names (DomainNet copies
            vary); ignored for an image folder.
        image_size: output side of the plain transform (needed when images differ in size).
        data_config: a timm model or data-config dict (replaces ``image_size``).
        cache_dir: datasets cache folder for Hub downloads.

    Returns:
        A ``datasets.Dataset`` with ``image``, ``domain``, ``label``.

    Raises:
        DatasetUnavailableError: a Hub name cannot be reached; pass ``data_dir=...``.
        ValueError: a missing column or split (named in the message), or a folder without images.
    """
    source, is_local = resolve_source(name_or_path, data_dir)
    if is_local and not is_save_to_disk_folder(source):
        dataset = _from_image_folder(Path(source))
    else:
        if is_local:
            loaded = datasets.load_from_disk(source)
        else:
            try:
                loaded = datasets.load_dataset(
                    source, cache_dir=None if cache_dir is None else str(cache_dir)
                )
            except hub_errors() as err:
                raise hub_unavailable_error(source, err, "<domain>/<class>/<image>") from err
        dataset = _pick_split(loaded, split)
        dataset = _standardize_domain_columns(dataset, image_column, domain_column, label_column)
    if data_config is not None and image_size is not None:
        raise ConfigError(
            "image_size and data_config were both given; data_config sets the input size, "
            "pass only one of them"
        )
    if data_config is not None:
        dataset = dataset.with_transform(timm_transform(data_config))
    elif image_size is not None:
        dataset = dataset.with_transform(
            image_transform(image_size, _IMAGENET_MEAN, _IMAGENET_STD, in_chans=3)
        )
    return dataset


def _pick_split(loaded: datasets.Dataset | datasets.DatasetDict, split: str | None) -> datasets.Dataset:
    if isinstance(loaded, datasets.Dataset):
        return loaded
    if split is not None:
        if split not in loaded:
            raise ConfigError(f"split={split!r} is not a split of the dataset; available: {list(loaded)}")
        return loaded[split]
    if len(loaded) == 1:
        return next(iter(loaded.values()))
    return datasets.concatenate_datasets(list(loaded.values()))


def _standardize_domain_columns(
    dataset: datasets.Dataset, image_column: str | None, domain_column: str, label_column: str
) -> datasets.Dataset:
    for arg, column in (("domain_column", domain_column), ("label_column", label_column)):
        if column not in dataset.column_names:
            raise ConfigError(
                f"{arg}={column!r} is not a column of the dataset (columns: "
                f"{dataset.column_names}); pass the name of that column"
            )
    image_column = find_image_column(dataset, image_column)
    renames = {image_column: IMAGE_COLUMN, domain_column: DOMAIN_COLUMN, label_column: LABEL_COLUMN}
    renames = {src: dst for src, dst in renames.items() if src != dst}
    clashes = [dst for dst in renames.values() if dst in dataset.column_names and dst not in renames]
    if clashes:
        raise ConfigError(
            f"image_column/domain_column/label_column: renaming {renames} would overwrite the "
            f"existing column(s) {clashes}; pass the columns holding the images, domains, labels"
        )
    if renames:
        dataset = dataset.rename_columns(renames)
    for column in (DOMAIN_COLUMN, LABEL_COLUMN):
        dataset = encode_class_column({"all": dataset}, column)["all"]
    return dataset


@dataclass(eq=False)
class DomainPartition(ClientPartition):
    """A :class:`~hf_fedflat.data.partition.ClientPartition` whose clients each hold one domain.

    Attributes (beyond those of ``ClientPartition``; ``scheme`` is ``"leave_one_domain_out"``):
        client_domains: the domain name of each client; clients are grouped by domain, in the
            order of ``domain_names``.
        held_out_domain: the test domain, held by no client.
        clients_per_domain: ``M``, the number of clients each training domain is split into.
        domain_names: the training domains, in client order.
    """

    client_domains: list[str] = field(default_factory=list)
    held_out_domain: str = ""
    clients_per_domain: int = 1
    domain_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.client_domains = [str(d) for d in self.client_domains]
        self.domain_names = [str(d) for d in self.domain_names]
        if len(self.client_domains) != self.num_clients:
            raise ConfigError(
                f"client_domains has {len(self.client_domains)} entries for {self.num_clients} clients"
            )

    def client_domain(self, client_id: int) -> str:
        """The domain of client ``client_id``."""
        return self.client_domains[int(client_id)]

    def domain_clients(self, domain: str) -> list[int]:
        """Ids of the clients holding ``domain`` (empty for the held-out domain)."""
        return [i for i, d in enumerate(self.client_domains) if d == domain]

    def describe_scheme(self) -> str:
        return (
            f"{self.scheme}(held_out={self.held_out_domain!r}, "
            f"clients_per_domain={self.clients_per_domain})"
        )

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(
            client_domains=list(self.client_domains), held_out_domain=self.held_out_domain,
            clients_per_domain=int(self.clients_per_domain), domain_names=list(self.domain_names),
        )
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DomainPartition:
        base = ClientPartition.from_dict(d)
        return cls(
            client_indices=base.client_indices, label_counts=base.label_counts, scheme=base.scheme,
            alpha=base.alpha, seed=base.seed, class_names=base.class_names,
            classes_per_client=base.classes_per_client, num_rows=base.num_rows,
            client_domains=list(d["client_domains"]), held_out_domain=d["held_out_domain"],
            clients_per_domain=int(d["clients_per_domain"]), domain_names=list(d["domain_names"]),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DomainPartition):
            return NotImplemented
        return (
            super().__eq__(other)
            and self.client_domains == other.client_domains
            and self.held_out_domain == other.held_out_domain
            and self.clients_per_domain == other.clients_per_domain
            and self.domain_names == other.domain_names
        )

    __hash__ = None


def leave_one_domain_out(
    dataset: datasets.Dataset,
    held_out_domain: str,
    clients_per_domain: int = 1,
    *,
    seed: int = 0,
    domain_column: str = DOMAIN_COLUMN,
    label_column: str = LABEL_COLUMN,
) -> tuple[datasets.Dataset, datasets.Dataset, DomainPartition]:
    """Hold one domain out as the test set and split the other domains into clients.

    The training set is every row of the other domains (in the dataset's order), the test set
    every row of ``held_out_domain``. Clients are grouped by domain in the sorted order of the
    domain names: with ``M = clients_per_domain``, clients ``0..M-1`` hold the first training
    domain, ``M..2M-1`` the second, and so on. A domain's rows are shuffled with a generator
    seeded by ``(seed, domain index)`` and cut into ``M`` parts whose sizes differ by at most
    one (``M = 1``: the client holds the whole domain). Every training row belongs to exactly
    one client; no client holds a test row. Both returned datasets are ``select`` views of
    ``dataset`` and keep its transform.

    Args:
        dataset: one ``Dataset`` with a domain and a label column (e.g. from
            :func:`load_domain_dataset`); any transform is bypassed while reading them.
        held_out_domain: name of the test domain.
        clients_per_domain: ``M``, clients per training domain (>= 1, at most the rows of the
            smallest training domain).
        seed: seed of the within-domain split.
        domain_column, label_column: columns to read (``ClassLabel`` or plain values).

    Returns:
        ``(train_dataset, test_dataset, partition)``; ``partition`` indexes ``train_dataset``
        and has ``M * (number of domains - 1)`` clients.

    Raises:
        ValueError: ``held_out_domain`` is not a domain (the message lists the domains), or
            ``clients_per_domain`` is out of range.
    """
    if isinstance(dataset, datasets.DatasetDict):
        raise TypeError(
            f"dataset must be one Dataset (all domains), got a DatasetDict with splits "
            f"{list(dataset)}; load it with load_domain_dataset or concatenate the splits"
        )
    if isinstance(clients_per_domain, bool) or not isinstance(clients_per_domain, (int, np.integer)) \
            or clients_per_domain < 1:
        raise ConfigError(f"clients_per_domain must be an int >= 1, got {clients_per_domain!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    for arg, column in (("domain_column", domain_column), ("label_column", label_column)):
        if column not in dataset.column_names:
            raise ConfigError(
                f"{arg}={column!r} is not a column of the dataset (columns: "
                f"{dataset.column_names}); pass the name of that column"
            )
    domain_ids, domain_names = class_ids(dataset, domain_column)
    label_ids, class_names = class_ids(dataset, label_column)
    present = [domain_names[i] for i in np.unique(domain_ids)]
    if str(held_out_domain) not in present:
        raise ConfigError(
            f"held_out_domain={held_out_domain!r} is not a domain of the dataset; available "
            f"domains: {present}"
        )
    held = domain_names.index(str(held_out_domain))
    train_rows = np.flatnonzero(domain_ids != held)
    test_rows = np.flatnonzero(domain_ids == held)
    train_domains = domain_ids[train_rows]
    train_labels = label_ids[train_rows]

    client_indices: list[np.ndarray] = []
    client_domains: list[str] = []
    training_domains = [name for name in present if name != str(held_out_domain)]
    if not training_domains:
        raise ConfigError(
            f"held_out_domain={held_out_domain!r} is the only domain: no training data is left"
        )
    for name in training_domains:
        index = domain_names.index(name)
        rows = np.flatnonzero(train_domains == index)  # positions in train_dataset
        if clients_per_domain > rows.size:
            raise ConfigError(
                f"clients_per_domain={clients_per_domain} exceeds the {rows.size} rows of domain "
                f"{name!r}; use at most {rows.size}"
            )
        shuffled = np.random.default_rng([int(seed), index]).permutation(rows)
        for part in np.array_split(shuffled, clients_per_domain):
            client_indices.append(np.sort(part).astype(np.int64))
            client_domains.append(name)
    label_counts = np.stack([
        np.bincount(train_labels[idx], minlength=len(class_names)) for idx in client_indices
    ])
    partition = DomainPartition(
        client_indices=client_indices,
        label_counts=label_counts,
        scheme=LEAVE_ONE_DOMAIN_OUT,
        alpha=None,
        seed=int(seed),
        class_names=class_names,
        num_rows=int(train_rows.size),
        client_domains=client_domains,
        held_out_domain=str(held_out_domain),
        clients_per_domain=int(clients_per_domain),
        domain_names=training_domains,
    )
    return dataset.select(train_rows), dataset.select(test_rows), partition
