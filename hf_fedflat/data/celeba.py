"""CelebA (LEAF): smiling or not, one client per celebrity.

Sources (:func:`load_celeba`):

* a LEAF folder (``data_dir``): LEAF's ``data/celeba/data`` after ``preprocess.sh`` -- ``train/*.json`` and
  ``test/*.json`` (:mod:`hf_fedflat.data.leaf`) whose ``x`` are image file names (``"000001.jpg"``) and ``y``
  the ``Smiling`` attribute (0/1) -- with the aligned images in ``raw/img_align_celeba/`` (LEAF's
  ``data/celeba/data/raw``; also looked for in the folder itself, its ``data/raw`` and its parent's ``raw``).
  LEAF's per-celebrity split is kept: client ``i`` trains on celebrity ``i``'s train images; the test images of
  every celebrity, pooled, evaluate the global model.
* the Hub copy (``flwrlabs/celeba``: ``image``, ``celeb_id`` and the 40 attributes) or a ``save_to_disk`` copy:
  one client per ``celeb_id`` with at least 5 images (LEAF's ``metadata_to_json.py`` keeps those), each
  celebrity's images split as LEAF's ``--by_sample --tf 0.9`` (seeded); the label is ``Smiling``
  (``--label_column`` for another attribute).

Images are decoded lazily (``datasets.Image`` over the file paths) and go through the image transform of
:mod:`hf_fedflat.data.images` (resized to ``--image_size``; LEAF's CNN reads 84x84 RGB; normalised with mean and
std 0.5 per channel, i.e. to [-1, 1]).
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import numpy as np

from .leaf import LeafClients, choose_users, contiguous_partition, natural_clients_from_rows, read_leaf
from ..field_checks import ConfigError

__all__ = ["CELEBA_CLASS_NAMES", "CELEBA_HUB", "CELEBA_MEAN", "CELEBA_STD", "find_celeba_images", "load_celeba",
           "write_celeba_leaf"]

CELEBA_HUB = "flwrlabs/celeba"
CELEBA_CLASS_NAMES = ["not_smiling", "smiling"]
CELEBA_MEAN = (0.5, 0.5, 0.5)
CELEBA_STD = (0.5, 0.5, 0.5)
IMAGE_FOLDER = "img_align_celeba"
#: LEAF keeps the celebrities with at least this many images
LEAF_MIN_IMAGES = 5


def find_celeba_images(root: str | os.PathLike) -> Path:
    """The ``img_align_celeba`` folder of a LEAF CelebA tree (see the module docstring)."""
    root = Path(root).expanduser()
    candidates = [root / "raw", root, root / "data" / "raw", root / "data", root.parent / "raw", root.parent]
    for candidate in candidates:
        if (candidate / IMAGE_FOLDER).is_dir():
            return candidate / IMAGE_FOLDER
    raise FileNotFoundError(
        f"data_dir={str(root)!r}: no {IMAGE_FOLDER}/ folder of CelebA images found (looked in "
        f"{', '.join(str(c) for c in candidates)}); LEAF keeps it in data/celeba/data/raw/{IMAGE_FOLDER}.")


def celeba_from_leaf(root: str | os.PathLike, *, max_clients: int | None = None, seed: int = 0) -> LeafClients:
    """CelebA from a LEAF folder: one client per celebrity, LEAF's train/test split, images read lazily.

    Raises:
        LeafFormatError: a malformed file (named), a label other than 0/1, an ``x`` that is not a file name.
        FileNotFoundError: no ``img_align_celeba`` folder, or images named in the JSON files missing from it.
    """
    images = find_celeba_images(root)

    def convert(user: str, x: list, y: list) -> tuple[list[str], np.ndarray]:
        if not all(isinstance(name, str) for name in x):
            raise ConfigError("x must be image file names (e.g. '000001.jpg')")
        labels = np.asarray(y, dtype=np.int64).reshape(-1)
        if labels.size and not np.isin(labels, (0, 1)).all():
            raise ConfigError("y must be 0 or 1 (the Smiling attribute)")
        return [str(images / name) for name in x], labels

    keep = (lambda users: choose_users(users, max_clients, seed)) if max_clients else None
    data = read_leaf(root, convert=convert, keep_users=keep)
    features = datasets.Features({"client_id": datasets.Value("int32"), "celeb_id": datasets.Value("string"),
                                  "image": datasets.Image(), "label": datasets.ClassLabel(names=CELEBA_CLASS_NAMES)})
    splits, partitions = {}, {}
    for split, table in (("train", data.train), ("test", data.test)):
        users = [u for u in data.users if u in table]
        sizes = [len(table[u][1]) for u in users]
        paths = [path for u in users for path in table[u][0]]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{len(missing)} image(s) named in {split}/*.json are not in {images} "
                                    f"(e.g. {Path(missing[0]).name}).")
        labels = np.concatenate([table[u][1] for u in users]) if users else np.zeros(0, np.int64)
        client_ids = np.repeat(np.arange(len(users), dtype=np.int32), sizes)
        splits[split] = datasets.Dataset.from_dict(
            {"client_id": client_ids, "celeb_id": [users[i] for i in client_ids], "image": paths, "label": labels},
            features=features, split=split)
        partitions[split] = contiguous_partition(sizes, labels, CELEBA_CLASS_NAMES, seed=seed)
    return LeafClients(dataset=datasets.DatasetDict(splits), partition=partitions["train"],
                       test_partition=partitions["test"], users=list(data.train))


def celeba_from_rows(dataset: datasets.Dataset, *, client_column: str = "celeb_id", label_column: str = "Smiling",
                     image_column: str | None = None, max_clients: int | None = None, seed: int = 0) -> LeafClients:
    """CelebA from a flat dataset (the Hub copy's layout), LEAF's way: celebrities with >= 5 images, split by
    sample (0.9), label ``label_column`` as 0/1 (booleans, 0/1 or CelebA's -1/1)."""
    from .images import column_values, find_image_column

    image_column = find_image_column(dataset, image_column)
    if image_column != "image":
        dataset = dataset.rename_column(image_column, "image")
    if label_column not in dataset.column_names:
        raise ConfigError(f"label_column: {label_column!r} is not a column of the CelebA copy (columns: "
                         f"{dataset.column_names}); CelebA's LEAF task is Smiling.")
    values = column_values(dataset, label_column)
    if values.dtype == bool:
        labels = values.astype(np.int64)
    elif set(np.unique(values).tolist()) <= {-1, 0, 1}:
        labels = (values > 0).astype(np.int64)
    else:
        raise ConfigError(f"label_column: {label_column!r} must hold a binary attribute (bool, 0/1 or -1/1).")
    return natural_clients_from_rows(dataset, client_column=client_column, label_ids=labels,
                                     class_names=CELEBA_CLASS_NAMES, keep_columns=["image"],
                                     min_samples=LEAF_MIN_IMAGES, max_clients=max_clients, seed=seed)


def load_celeba(name_or_path: str = CELEBA_HUB, *, data_dir: str | os.PathLike | None = None,
                max_clients: int | None = None, seed: int = 0, label_column: str | None = None,
                image_column: str | None = None, client_column: str = "celeb_id",
                cache_dir: str | os.PathLike | None = None) -> LeafClients:
    """CelebA from a LEAF folder (``data_dir`` or ``name_or_path``), or the Hub / a ``save_to_disk`` copy."""
    from .femnist import is_leaf_folder
    from .images import load_image_dataset

    for path in (data_dir, name_or_path):
        if is_leaf_folder(path):
            return celeba_from_leaf(path, max_clients=max_clients, seed=seed)
    raw = load_image_dataset(name_or_path, data_dir=data_dir, cache_dir=cache_dir)
    table = datasets.concatenate_datasets(list(raw.values())) if len(raw) > 1 else next(iter(raw.values()))
    return celeba_from_rows(table, client_column=client_column, label_column=label_column or "Smiling",
                            image_column=image_column, max_clients=max_clients, seed=seed)


def write_celeba_leaf(root: str | os.PathLike, *, num_celebrities: int = 6, images_per_celebrity: int = 8,
                      train_fraction: float = 0.9, num_files: int = 2, seed: int = 0) -> Path:
    """A tiny CelebA in LEAF's layout: ``root/{train,test}/*.json`` (x = file names, y = smiling 0/1) and the
    aligned 178x218 JPEG images in ``root/raw/img_align_celeba/`` (named ``000001.jpg``, ...), for ``--smoke``
    and tests. A smiling face is drawn with a bright mouth band, so the label can be learned."""
    from PIL import Image

    from .leaf import split_by_sample, write_leaf

    root = Path(root)
    folder = root / "raw" / IMAGE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    train, test = {}, {}
    number = 0
    for c in range(num_celebrities):
        skin = rng.uniform(90, 200, size=3)
        names, labels = [], []
        for _ in range(images_per_celebrity):
            number += 1
            smiling = int(rng.integers(0, 2))
            pixels = np.clip(skin + rng.normal(0, 12, size=(218, 178, 3)), 0, 255)
            pixels[140:165, 50:128] = 250.0 if smiling else 30.0
            name = f"{number:06d}.jpg"
            Image.fromarray(pixels.astype(np.uint8)).save(folder / name, quality=90)
            names.append(name)
            labels.append(smiling)
        tr, te = split_by_sample(len(names), train_fraction, rng)
        celeb = str(1000 + c)
        train[celeb] = ([names[i] for i in tr], [labels[i] for i in tr])
        test[celeb] = ([names[i] for i in te], [labels[i] for i in te])
    write_leaf(root, "train", train, num_files=num_files)
    write_leaf(root, "test", test, num_files=num_files)
    return root
