"""FEMNIST (LEAF): 62-class handwritten characters, one client per writer.

Sources (:func:`load_femnist`):

* a LEAF folder (``data_dir``): LEAF's ``data/femnist/data`` after ``preprocess.sh`` (``train/*.json`` and
  ``test/*.json``, read by :mod:`hf_fedflat.data.leaf`). Each ``x`` is a 28x28 grey image flattened to 784
  floats in [0, 1] (LEAF divides the 8-bit pixel by 255; 1.0 is the white background), each ``y`` a class id:
  ``0-9`` digits, ``10-35`` ``A-Z``, ``36-61`` ``a-z`` (:data:`FEMNIST_CLASS_NAMES`). LEAF's own split (by
  sample, per writer) is kept: client ``i`` trains on writer ``i``'s train samples, and the test samples of
  every writer, pooled, evaluate the global model (``test_partition`` has them per writer).
* the Hub copy (``flwrlabs/femnist``: ``image``, ``writer_id``, ``character``, one ``train`` split), or a
  ``save_to_disk`` copy of it: one client per ``writer_id``, each writer's samples split as LEAF's
  ``split_data.py --by_sample --tf 0.9`` does (:func:`~hf_fedflat.data.leaf.split_by_sample`, seeded).

Storage: pixels are kept as ``uint8`` (``round(255 x)``; lossless for LEAF's values, 784 bytes an image: the
~805,000 images of FEMNIST take ~630 MB instead of 2.5 GB of float32) in one Arrow table grouped by writer,
so the natural partition is a list of contiguous ranges (:func:`~hf_fedflat.data.leaf.contiguous_partition`,
milliseconds for 3,500 writers). Each writer's Python lists are dropped as soon as its file is converted.
The transform (:func:`femnist_transform`) gives ``pixel_values`` in [0, 1] as LEAF's models see them
(``[B, 1, 28, 28]``; resized / repeated to 3 channels on request) and ``labels``.

Model: LEAF's FEMNIST CNN is ``small_cnn`` at 28x28 with a 2048-unit dense layer
(``--model_name small_cnn --image_size 28 --model_kwargs '{"hidden_dim": 2048}'``: two 5x5 "same" convolutions
with 32 and 64 channels, each with a 2x2 max-pool); ``fedgam_cnn`` is the same with 512 units (FedAvg's).
"""

from __future__ import annotations

import hashlib
import logging
import os
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F

from .leaf import LeafClients, choose_users, contiguous_partition, natural_clients_from_rows, read_leaf, split_by_sample
from ..field_checks import ConfigError

__all__ = [
    "FEMNIST_CLASS_NAMES",
    "FEMNIST_HUB",
    "FEMNIST_IMAGE_SIZE",
    "femnist_from_leaf",
    "femnist_from_rows",
    "femnist_transform",
    "is_leaf_folder",
    "load_femnist",
    "write_femnist_leaf",
]

logger = logging.getLogger(__name__)

FEMNIST_HUB = "flwrlabs/femnist"
FEMNIST_IMAGE_SIZE = 28
#: LEAF's class order: digits, upper case, lower case (62 classes)
FEMNIST_CLASS_NAMES: list[str] = list(string.digits + string.ascii_uppercase + string.ascii_lowercase)
_PIXELS = FEMNIST_IMAGE_SIZE * FEMNIST_IMAGE_SIZE


def femnist_features() -> datasets.Features:
    return datasets.Features({
        "client_id": datasets.Value("int32"),
        "writer_id": datasets.Value("string"),
        "pixels": datasets.List(datasets.Value("uint8"), length=_PIXELS),
        "label": datasets.ClassLabel(names=FEMNIST_CLASS_NAMES),
    })


def is_leaf_folder(path: str | os.PathLike | None) -> bool:
    """True for a folder with LEAF's ``train/*.json`` (itself or below ``data/``)."""
    if path is None:
        return False
    path = Path(path).expanduser()
    return any(next((p / "train").glob("*.json"), None) is not None for p in (path, path / "data") if
               (p / "train").is_dir())


def _quantize(user: str, x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    """One writer's LEAF lists -> ``(uint8 [n, 784], int64 [n])``, checked."""
    pixels = np.asarray(x, dtype=np.float32)
    labels = np.asarray(y, dtype=np.int64)
    if pixels.ndim != 2 or pixels.shape[1] != _PIXELS:
        if pixels.size == 0 and labels.size == 0:
            return np.zeros((0, _PIXELS), np.uint8), labels.reshape(0)
        raise ConfigError(f"x must be a list of {_PIXELS} floats per sample (28x28 flattened), got shape {pixels.shape}")
    if pixels.size and (not np.isfinite(pixels).all() or pixels.min() < 0.0 or pixels.max() > 1.0):
        raise ConfigError("x values must be in [0, 1] (LEAF's pixel / 255)")
    if labels.ndim != 1 or (labels.size and (labels.min() < 0 or labels.max() >= len(FEMNIST_CLASS_NAMES))):
        raise ConfigError(f"y must be class ids in [0, {len(FEMNIST_CLASS_NAMES)})")
    return np.rint(pixels * 255.0).astype(np.uint8), labels


def _digest(*parts: Any) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(np.ascontiguousarray(part).data if isinstance(part, np.ndarray) else str(part).encode())
    return digest.hexdigest()


def _uint8_rows(pixels: np.ndarray):
    """``uint8 [n, 784]`` as an Arrow fixed-size-list array over the same memory (no copy)."""
    import pyarrow as pa

    flat = np.ascontiguousarray(pixels, dtype=np.uint8).reshape(-1)
    values = pa.Array.from_buffers(pa.uint8(), flat.size, [None, pa.py_buffer(flat)])
    return pa.FixedSizeListArray.from_arrays(values, _PIXELS)


def _grouped_split(users: Sequence[str], rows: Sequence[tuple[np.ndarray, np.ndarray]], split: str) -> datasets.Dataset:
    """One Arrow table, rows grouped by user in ``users`` order: each user's pixels become one chunk of the
    table over the user's own array (no concatenated copy of the ~630 MB of FEMNIST pixels)."""
    import pyarrow as pa
    from datasets.table import InMemoryTable

    sizes = np.array([len(y) for _, y in rows], dtype=np.int64)
    client_ids = np.repeat(np.arange(len(users), dtype=np.int32), sizes)
    labels = np.concatenate([y for _, y in rows]) if rows else np.zeros(0, np.int64)
    features = femnist_features()
    pixel_type = features.arrow_schema.field("pixels").type
    chunks = [_uint8_rows(p) for p, _ in rows if len(p)]
    pixel_column = pa.chunked_array(chunks, type=pixel_type) if chunks else pa.chunked_array([], type=pixel_type)
    sample = [np.asarray(p[:1]) for p, _ in rows[:: max(1, len(rows) // 64)]]
    table = pa.Table.from_arrays(
        [pa.array(client_ids), pa.array(list(users), type=pa.string()).take(pa.array(client_ids)), pixel_column,
         pa.array(labels)], schema=features.arrow_schema)
    info = datasets.DatasetInfo(description="FEMNIST (LEAF), one client per writer", homepage="https://leaf.cmu.edu/",
                                citation="Caldas et al. 2018, LEAF: A Benchmark for Federated Settings, "
                                         "arXiv:1812.01097", features=features)
    # a content hash as fingerprint: datasets would otherwise hash the whole table
    return datasets.Dataset(InMemoryTable(table), info=info, split=split,
                            fingerprint=_digest(split, "|".join(users), sizes, labels, *sample))


CACHE_FOLDER = "hf_fedflat_cache"
_CACHE_VERSION = 1


def _cache_path(root: Path, max_clients: int | None, seed: int) -> Path:
    """``<root>/hf_fedflat_cache/femnist-<key>``: the key hashes the JSON files' names, sizes and modification
    times, ``max_clients`` and ``seed`` (a changed file is a new key)."""
    from .leaf import leaf_split_files

    parts = [f"v{_CACHE_VERSION}", str(max_clients), str(seed if max_clients else 0)]
    for split in ("train", "test"):
        for path in leaf_split_files(root, split):
            stat = path.stat()
            parts.append(f"{split}/{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return root / CACHE_FOLDER / f"femnist-{_digest(*parts)}"


def _partitions_of(dataset: datasets.DatasetDict, sizes: dict[str, list[int]], seed: int) -> dict[str, Any]:
    out = {}
    for split in ("train", "test"):
        labels = np.asarray(dataset[split].data.column("label").to_numpy(), dtype=np.int64)
        out[split] = contiguous_partition(sizes[split], labels, FEMNIST_CLASS_NAMES, seed=seed)
    return out


def _load_cache(path: Path, seed: int) -> LeafClients | None:
    import json

    try:
        meta = json.loads((path / "clients.json").read_text())
        dataset = datasets.load_from_disk(str(path / "dataset"))  # memory-mapped: the pixels stay on disk
    except (OSError, ValueError, KeyError) as err:
        logger.warning("FEMNIST cache %s unreadable (%s): reading the JSON files again.", path, err)
        return None
    parts = _partitions_of(dataset, meta["sizes"], seed)
    return LeafClients(dataset=dataset, partition=parts["train"], test_partition=parts["test"], users=meta["users"])


def _save_cache(clients: LeafClients, path: Path, sizes: dict[str, list[int]]) -> bool:
    import json
    import shutil

    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        clients.dataset.save_to_disk(str(tmp / "dataset"))
        (tmp / "clients.json").write_text(json.dumps({"users": clients.users, "sizes": sizes}))
        os.replace(tmp, path)  # atomic: a reader sees a complete cache or none
        return True
    except OSError as err:  # read-only data folder, another process won the race, disk full
        logger.info("FEMNIST: no cache written in %s (%s); the JSON files are read again next time.", path.parent, err)
        shutil.rmtree(tmp, ignore_errors=True)
        return path.is_dir()


def femnist_from_leaf(root: str | os.PathLike, *, max_clients: int | None = None, seed: int = 0,
                      cache: bool = True) -> LeafClients:
    """FEMNIST from a LEAF folder (``train/*.json`` + ``test/*.json``), one client per writer, LEAF's split.

    Args:
        root: LEAF's ``data/femnist/data`` (or ``data/femnist``).
        max_clients: keep this many writers (a seeded draw, in file order); the others are never converted.
        seed: seed of the ``max_clients`` draw.
        cache: keep the converted Arrow tables in ``<root>/hf_fedflat_cache/femnist-<key>`` (``save_to_disk``)
            and load them memory-mapped from there: parsing LEAF's JSON (minutes for the ~3,500 writers) happens
            once per version of the files, and the pixels are not held in memory. Skipped (logged) when the
            folder is not writable.

    Raises:
        LeafFormatError: a malformed file (named), or a sample that is not 784 values in [0, 1].
    """
    from .leaf import resolve_leaf_root

    root = resolve_leaf_root(root)
    path = _cache_path(root, max_clients, seed) if cache else None
    if path is not None and (path / "clients.json").is_file():
        cached = _load_cache(path, seed)
        if cached is not None:
            return cached
    keep = (lambda users: choose_users(users, max_clients, seed)) if max_clients else None
    data = read_leaf(root, convert=_quantize, keep_users=keep)
    train_users = list(data.train)
    test_users = [u for u in data.users if u in data.test]
    splits, sizes = {}, {}
    for split, users, table in (("train", train_users, data.train), ("test", test_users, data.test)):
        rows = [table[u] for u in users]
        for u in users:  # the per-writer arrays now live in the table
            table[u] = None
        splits[split] = _grouped_split(users, rows, split)
        del rows
        sizes[split] = [data.num_samples[split][u] for u in users]
    if data.split_by == "user":  # LEAF --by_user: the test writers are other writers (test_partition indexes them)
        logger.info("FEMNIST: LEAF split by user: %d train writers, %d test writers.", len(train_users),
                    len(test_users))
    clients = LeafClients(dataset=datasets.DatasetDict(splits), partition=None, test_partition=None, users=train_users)
    if path is not None and _save_cache(clients, path, sizes):
        cached = _load_cache(path, seed)
        if cached is not None:
            return cached
    parts = _partitions_of(clients.dataset, sizes, seed)
    clients.partition, clients.test_partition = parts["train"], parts["test"]
    return clients


def _leaf_label_ids(dataset: datasets.Dataset, label_column: str) -> np.ndarray:
    """The label column as LEAF's class ids (ClassLabel names mapped by character, else ints in [0, 62))."""
    from .images import column_values

    if label_column not in dataset.column_names:
        raise ConfigError(f"label_column: {label_column!r} is not a column of the FEMNIST copy (columns: "
                         f"{dataset.column_names}); pass --label_column.")
    values = column_values(dataset, label_column)
    feature = dataset.features[label_column]
    if isinstance(feature, datasets.ClassLabel) and set(feature.names) <= set(FEMNIST_CLASS_NAMES):
        remap = np.array([FEMNIST_CLASS_NAMES.index(name) for name in feature.names], dtype=np.int64)
        return remap[values.astype(np.int64)]
    if values.dtype.kind in "iu" and (values.size == 0 or (values.min() >= 0 and values.max() < 62)):
        return values.astype(np.int64)
    if values.dtype.kind in "UO" and set(map(str, np.unique(values))) <= set(FEMNIST_CLASS_NAMES):
        index = {name: i for i, name in enumerate(FEMNIST_CLASS_NAMES)}
        return np.array([index[str(v)] for v in values], dtype=np.int64)
    raise ConfigError(f"label_column: {label_column!r} holds neither FEMNIST's 62 characters nor class ids in [0, 62).")


def femnist_from_rows(
    dataset: datasets.Dataset,
    *,
    writer_column: str = "writer_id",
    label_column: str = "character",
    image_column: str | None = None,
    train_fraction: float = 0.9,
    max_clients: int | None = None,
    seed: int = 0,
) -> LeafClients:
    """FEMNIST from a flat dataset of images (the Hub copy's layout): one client per writer, each writer's
    samples split as LEAF's ``--by_sample --tf 0.9`` (writers with < 2 samples dropped, as LEAF does).

    Writers are ordered by id; ``max_clients`` keeps a seeded draw of them. Columns of the result: ``client_id``,
    ``writer_id``, ``image`` (the source's images, decoded lazily) and ``label`` (LEAF's class ids).
    """
    from .images import find_image_column

    image_column = find_image_column(dataset, image_column)
    if image_column != "image":
        dataset = dataset.rename_column(image_column, "image")
    return natural_clients_from_rows(
        dataset, client_column=writer_column, label_ids=_leaf_label_ids(dataset, label_column),
        class_names=FEMNIST_CLASS_NAMES, keep_columns=["image"], train_fraction=train_fraction,
        max_clients=max_clients, seed=seed)


def load_femnist(
    name_or_path: str = FEMNIST_HUB,
    *,
    data_dir: str | os.PathLike | None = None,
    max_clients: int | None = None,
    seed: int = 0,
    label_column: str | None = None,
    image_column: str | None = None,
    writer_column: str = "writer_id",
    cache_dir: str | os.PathLike | None = None,
) -> LeafClients:
    """FEMNIST from a LEAF folder (``data_dir`` or ``name_or_path``), or the Hub copy / a ``save_to_disk`` copy
    of it (see the module docstring). ``max_clients``: a seeded draw of writers."""
    for path in (data_dir, name_or_path):
        if is_leaf_folder(path):
            return femnist_from_leaf(path, max_clients=max_clients, seed=seed)
    from .images import load_image_dataset

    raw = load_image_dataset(name_or_path, data_dir=data_dir, cache_dir=cache_dir)
    table = datasets.concatenate_datasets(list(raw.values())) if len(raw) > 1 else next(iter(raw.values()))
    return femnist_from_rows(table, writer_column=writer_column, label_column=label_column or "character",
                             image_column=image_column, max_clients=max_clients, seed=seed)


def femnist_transform(image_size: int | None = None, in_chans: int = 1):
    """Batch transform: ``pixels`` (uint8 784) or ``image`` (PIL) -> ``pixel_values`` float32 ``[B, in_chans, S, S]``
    in [0, 1] as LEAF stores them (1.0 = white background; ``S`` = ``image_size``, 28 by default), ``labels``."""
    if in_chans not in (1, 3):
        raise ConfigError(f"in_chans must be 1 or 3, got {in_chans!r}")
    size = FEMNIST_IMAGE_SIZE if image_size is None else int(image_size)

    def transform(batch: dict[str, list]) -> dict[str, torch.Tensor]:
        if "pixels" in batch:
            array = np.asarray(batch["pixels"], dtype=np.uint8).reshape(-1, 1, FEMNIST_IMAGE_SIZE, FEMNIST_IMAGE_SIZE)
        else:
            array = np.stack([np.asarray(image.convert("L")) for image in batch["image"]])[:, None]
        pixels = torch.from_numpy(array).float().div_(255.0)
        if pixels.shape[-1] != size and pixels.shape[0]:
            pixels = F.interpolate(pixels, size=(size, size), mode="bilinear", align_corners=False,
                                   antialias=size < pixels.shape[-1])
        if in_chans == 3:
            pixels = pixels.expand(-1, 3, -1, -1).contiguous()
        out = {"pixel_values": pixels}
        if "label" in batch:
            out["labels"] = torch.as_tensor(np.asarray(batch["label"], dtype=np.int64))
        return out

    return transform


def write_femnist_leaf(root: str | os.PathLike, *, num_writers: int = 6, samples_per_writer: int = 24,
                       num_classes: int = 10, num_files: int = 2, train_fraction: float = 0.9, seed: int = 0) -> Path:
    """A tiny FEMNIST in LEAF's format (``root/train/*.json``, ``root/test/*.json``) for ``--smoke`` and tests.

    Each class is a dark random stroke pattern on a white (1.0) background, each writer shifts it by a pixel or
    two; values are ``k / 255`` as in LEAF. Writers are named like LEAF's (``f0000_14``), split by sample.
    """
    from .leaf import write_leaf

    rng = np.random.default_rng(seed)
    templates = rng.random((num_classes, FEMNIST_IMAGE_SIZE, FEMNIST_IMAGE_SIZE)) < 0.15
    train, test = {}, {}
    for w in range(num_writers):
        n = int(samples_per_writer + rng.integers(-samples_per_writer // 4, samples_per_writer // 4 + 1))
        labels = rng.integers(0, num_classes, size=n)
        shift = rng.integers(-1, 2, size=2)
        images = np.ones((n, FEMNIST_IMAGE_SIZE, FEMNIST_IMAGE_SIZE))
        for i, c in enumerate(labels):
            ink = np.roll(templates[c], tuple(shift), axis=(0, 1))
            images[i][ink] = rng.integers(0, 80, size=int(ink.sum())) / 255.0
        x = np.rint(images.reshape(n, -1) * 255.0) / 255.0
        tr, te = split_by_sample(n, train_fraction, rng)
        name = f"f{w:04d}_{rng.integers(10, 99)}"
        train[name] = (x[tr], labels[tr])
        test[name] = (x[te], labels[te])
    write_leaf(root, "train", train, num_files=num_files)
    write_leaf(root, "test", test, num_files=num_files)
    return Path(root)
