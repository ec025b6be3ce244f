"""Synthetic(alpha, beta): the federated logistic-regression data of FedProx (Li et al. 2020, Sec. 5.1), the
``synthetic`` dataset LEAF lists beside it, generated here offline, seeded and deterministic.

The construction (paper, Sec. 5.1 and Appendix C.1; FedProx's ``data/synthetic_*/generate_niid.py``)::

    per client k:   u_k ~ N(0, alpha)            B_k ~ N(0, beta)
                    W_k[j, c] ~ N(u_k, 1)         b_k[c] ~ N(u_k, 1)          (W_k: 60 x 10, b_k: 10)
                    v_k[j] ~ N(B_k, 1)                                          (v_k: 60)
                    x ~ N(v_k, Sigma),  Sigma = diag(j ** -1.2), j = 1..60
                    y = argmax(softmax(x W_k + b_k))
                    n_k = floor(lognormal(4, 2)) + 50                           (a power law of sizes)

``alpha`` controls how much the clients' models differ, ``beta`` how much their inputs differ;
Synthetic(0, 0), (0.5, 0.5) and (1, 1) are the paper's settings. ``iid=True`` is its Synthetic-IID: one
``W, b ~ N(0, 1)`` for every client and ``v_k = 0`` (so ``x ~ N(0, Sigma)`` everywhere). As in FedProx's code,
``alpha`` and ``beta`` are the standard deviations numpy's ``normal(0, alpha)`` receives (the paper writes
``N(0, alpha)``; its generator passes alpha as the scale). Each client's first ``floor(0.9 n_k)`` samples
train, the rest test (FedProx's split; its samples are i.i.d. within a client, so order is no bias).

LEAF's own ``data/synthetic/main.py`` draws a different, cluster-based model; a LEAF-format folder of either
(``train/*.json``, ``test/*.json``: ``x`` lists of 60 floats, ``y`` class ids) loads with :func:`load_synthetic`
through ``data_dir``.

Rows: ``client_id``, ``user`` (``f_00000``, FedProx's names), ``features`` (float32, 60), ``label`` (int).
:func:`synthetic_transform` gives ``pixel_values [B, 60, 1, 1]`` for the ``logistic`` model
(``--model_name logistic --image_size 1``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch

from .leaf import LeafClients, choose_users, contiguous_partition, read_leaf
from ..field_checks import ConfigError

__all__ = ["SYNTHETIC_DIM", "SYNTHETIC_NUM_CLASSES", "SyntheticParameters", "generate_synthetic", "load_synthetic",
           "synthetic_clients", "synthetic_transform", "write_synthetic_leaf"]

SYNTHETIC_DIM = 60
SYNTHETIC_NUM_CLASSES = 10


@dataclass
class SyntheticParameters:
    """The draws behind :func:`generate_synthetic`'s data (for tests and analysis), one row per client."""

    u: np.ndarray        # [K]          mean of client k's model entries
    B: np.ndarray        # [K]          mean of client k's input mean
    W: np.ndarray        # [K, 60, 10]
    b: np.ndarray        # [K, 10]
    v: np.ndarray        # [K, 60]      client k's input mean
    sigma_diag: np.ndarray  # [60]      diag of Sigma (j ** -1.2)
    sizes: np.ndarray    # [K]          samples per client


def _check(name: str, value, *, low: float = 0.0, integer: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer) if integer else (int, float, np.number))
    if not ok or not np.isfinite(value) or value < low:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name} must be {kind} >= {low}, got {value!r}")


def generate_synthetic(
    alpha: float = 1.0,
    beta: float = 1.0,
    *,
    num_users: int = 30,
    iid: bool = False,
    dim: int = SYNTHETIC_DIM,
    num_classes: int = SYNTHETIC_NUM_CLASSES,
    seed: int = 0,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], SyntheticParameters]:
    """Synthetic(alpha, beta) for ``num_users`` clients (see the module docstring).

    Returns:
        ``[(x float32 [n_k, dim], y int64 [n_k]) per client]`` (all samples, before the train/test split) and the
        :class:`SyntheticParameters` they were drawn from. Same arguments, same data.
    """
    _check("alpha", alpha)
    _check("beta", beta)
    _check("num_users", num_users, low=1, integer=True)
    _check("dim", dim, low=1, integer=True)
    _check("num_classes", num_classes, low=2, integer=True)
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, num_users).astype(np.int64) + 50
    u = rng.normal(0.0, alpha, num_users)
    B = rng.normal(0.0, beta, num_users)
    sigma_diag = np.arange(1, dim + 1, dtype=np.float64) ** -1.2
    if iid:
        v = np.zeros((num_users, dim))
        W_global = rng.normal(0.0, 1.0, (dim, num_classes))
        b_global = rng.normal(0.0, 1.0, num_classes)
        W = np.broadcast_to(W_global, (num_users, dim, num_classes)).copy()
        b = np.broadcast_to(b_global, (num_users, num_classes)).copy()
    else:
        v = rng.normal(B[:, None], 1.0, (num_users, dim))
        W = rng.normal(u[:, None, None], 1.0, (num_users, dim, num_classes))
        b = rng.normal(u[:, None], 1.0, (num_users, num_classes))
    clients = []
    for k in range(num_users):
        x = v[k] + rng.standard_normal((int(sizes[k]), dim)) * np.sqrt(sigma_diag)
        y = np.argmax(x @ W[k] + b[k], axis=1)  # softmax is monotone: its argmax is the logits'
        clients.append((x.astype(np.float32), y.astype(np.int64)))
    return clients, SyntheticParameters(u=u, B=B, W=W, b=b, v=v, sigma_diag=sigma_diag, sizes=sizes)


def _table(users: list[str], rows: list[tuple[np.ndarray, np.ndarray]], split: str, dim: int,
           num_classes: int) -> datasets.Dataset:
    sizes = [len(y) for _, y in rows]
    client_ids = np.repeat(np.arange(len(users), dtype=np.int32), sizes)
    x = np.concatenate([r[0] for r in rows]).astype(np.float32) if rows else np.zeros((0, dim), np.float32)
    y = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, np.int64)
    features = datasets.Features({"client_id": datasets.Value("int32"), "user": datasets.Value("string"),
                                  "features": datasets.List(datasets.Value("float32"), length=dim),
                                  "label": datasets.ClassLabel(names=[str(c) for c in range(num_classes)])})
    return datasets.Dataset.from_dict({"client_id": client_ids, "user": [users[i] for i in client_ids],
                                       "features": x, "label": y}, features=features, split=split)


def _assemble(users: list[str], train: list, test: list, seed: int) -> LeafClients:
    dim = next((r[0].shape[1] for r in train if len(r[0])), SYNTHETIC_DIM)
    top = max((int(r[1].max()) for r in [*train, *test] if len(r[1])), default=0)
    num_classes = max(SYNTHETIC_NUM_CLASSES, top + 1)
    splits = {split: _table(users, rows, split, dim, num_classes) for split, rows in (("train", train), ("test", test))}
    names = [str(c) for c in range(num_classes)]
    partitions = {split: contiguous_partition([len(r[1]) for r in rows], np.concatenate([r[1] for r in rows]), names,
                                              seed=seed)
                  for split, rows in (("train", train), ("test", test))}
    return LeafClients(dataset=datasets.DatasetDict(splits), partition=partitions["train"],
                       test_partition=partitions["test"], users=users)


def synthetic_clients(alpha: float = 1.0, beta: float = 1.0, *, num_users: int = 30, iid: bool = False,
                      train_fraction: float = 0.9, seed: int = 0) -> LeafClients:
    """Synthetic(alpha, beta) as clients: client ``k`` trains on its first ``floor(train_fraction n_k)`` samples;
    every client's remaining samples, pooled, are the test split (``test_partition`` per client)."""
    if not 0.0 < float(train_fraction) < 1.0:
        raise ConfigError(f"train_fraction must be in (0, 1) (FedProx: 0.9), got {train_fraction!r}")
    clients, _ = generate_synthetic(alpha, beta, num_users=num_users, iid=iid, seed=seed)
    users = [f"f_{k:05d}" for k in range(num_users)]
    train, test = [], []
    for x, y in clients:
        n_train = int(train_fraction * len(y))
        train.append((x[:n_train], y[:n_train]))
        test.append((x[n_train:], y[n_train:]))
    return _assemble(users, train, test, seed)


def synthetic_from_leaf(root: str | os.PathLike, *, max_clients: int | None = None, seed: int = 0) -> LeafClients:
    """A LEAF-format synthetic folder (LEAF's or FedProx's generator output), one client per user."""

    def convert(user: str, x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
        features = np.asarray(x, dtype=np.float32)
        labels = np.asarray(y, dtype=np.int64).reshape(-1)
        if features.ndim != 2 and features.size:
            raise ConfigError(f"x must be one list of floats per sample, got shape {features.shape}")
        if labels.size and labels.min() < 0:
            raise ConfigError("y must be class ids >= 0")
        return features.reshape(len(labels), -1), labels

    keep = (lambda users: choose_users(users, max_clients, seed)) if max_clients else None
    data = read_leaf(root, convert=convert, keep_users=keep)
    dims = {x.shape[1] for x, _ in [*data.train.values(), *data.test.values()] if len(x)}
    if len(dims) > 1:
        raise ConfigError(f"{root}: samples of different lengths {sorted(dims)}; every x must have the same length.")
    users = list(data.train)
    if data.split_by == "user":
        raise ConfigError(f"{root}: train and test hold different users; synthetic's clients are split by sample.")
    return _assemble(users, [data.train[u] for u in users], [data.test[u] for u in users], seed)


def load_synthetic(*, data_dir: str | os.PathLike | None = None, alpha: float = 1.0, beta: float = 1.0,
                   num_users: int = 30, iid: bool = False, max_clients: int | None = None,
                   seed: int = 0) -> LeafClients:
    """Generated Synthetic(alpha, beta) (:func:`synthetic_clients`), or a LEAF-format folder (``data_dir``)."""
    if data_dir is not None:
        return synthetic_from_leaf(data_dir, max_clients=max_clients, seed=seed)
    return synthetic_clients(alpha, beta, num_users=num_users, iid=iid, seed=seed)


def write_synthetic_leaf(root: str | os.PathLike, *, alpha: float = 1.0, beta: float = 1.0, num_users: int = 6,
                         seed: int = 0) -> Path:
    """Synthetic(alpha, beta) written in LEAF's format (``root/{train,test}/*.json``; FedProx's user names)."""
    from .leaf import write_leaf

    clients = synthetic_clients(alpha, beta, num_users=num_users, seed=seed)
    for split in ("train", "test"):
        table = clients.dataset[split].with_format("numpy")
        part = clients.partition if split == "train" else clients.test_partition
        rows = [table[part.client_indices[k]] for k in range(len(clients.users))]
        write_leaf(root, split, {user: (rows[k]["features"], rows[k]["label"]) for k, user in enumerate(clients.users)},
                   num_files=2)
    return Path(root)


def synthetic_transform():
    """Batch transform: ``features`` -> ``pixel_values`` float32 ``[B, dim, 1, 1]`` (for ``logistic``), ``labels``."""

    def transform(batch: dict[str, list]) -> dict[str, torch.Tensor]:
        x = torch.as_tensor(np.asarray(batch["features"], dtype=np.float32))
        out = {"pixel_values": x.reshape(x.shape[0], -1, 1, 1)}
        if "label" in batch:
            out["labels"] = torch.as_tensor(np.asarray(batch["label"], dtype=np.int64))
        return out

    return transform
