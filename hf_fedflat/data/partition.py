"""Split a ``datasets.Dataset`` into federated clients with flwr-datasets partitioners.

The splitting itself is done by `flwr-datasets <https://flower.ai/docs/datasets/>`_
(``IidPartitioner``, ``DirichletPartitioner``, ``InnerDirichletPartitioner``,
``PathologicalPartitioner``); this module only

* hands them a tiny two-column dataset (encoded label, original row id), so no image is
  ever decoded or transformed while partitioning, and the row ids of each client are
  recovered exactly;
* validates the arguments up front with messages naming the argument and the fix;
* returns a :class:`ClientPartition`: sorted row indices per client plus the label
  counts, serialisable to JSON for checkpoints and model cards.

Schemes (``partition_dataset(..., scheme=...)``):

``"iid"``
    Rows shuffled with ``seed``, then cut into ``num_clients`` contiguous shards of
    equal size (±1). flwr's ``IidPartitioner`` is a plain contiguous ``Dataset.shard``
    with no shuffle and no seed: on a label-sorted dataset it would give non-IID
    clients, so the rows are permuted before they reach it.
``"dirichlet"``
    For each class, the class's rows are divided among clients with proportions drawn
    from ``Dir(alpha)`` over clients (Yurochkin et al. 2019; the FedML/NIID-Bench
    "hetero" split). Client sizes vary. flwr redraws (up to 11 draws) until every client
    has ``min_partition_size`` rows.
``"inner_dirichlet"``
    Equal client sizes (dataset size split as evenly as possible); each client's class
    mix is drawn from ``Dir(alpha)`` over classes and filled sample by sample
    (FedDyn, Acar et al. 2021; used by FedSMOO).
``"linear"``
    Size-skewed clients (flwr's ``LinearPartitioner``: client ``i``'s size proportional to ``i + 1``) over rows
    shuffled with ``seed``. (flwr's square and exponential sizes leave the first clients empty already at 20
    clients of 1,400 rows, so they are not offered.) Like ``"iid"`` it needs no label column (a dataset without one, or with sequence labels as a language
    model's, is counted as one class ``"all"``).
``"pathological"``
    Each client holds exactly ``classes_per_client`` classes; each class's rows are
    split evenly among the clients holding it (Li et al. 2021, NIID-Bench
    "#C=k"). Class assignment is flwr's ``"first-deterministic"`` mode: client ``i`` gets
    class ``i % num_classes`` plus random others, so with ``num_clients >= num_classes``
    every class (hence every row) is used.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from ..field_checks import ConfigError, fail
from ..runtime.datasets import select_rows  # (re-exported: hf_fedflat.data.select_rows)

__all__ = [
    "LABEL_FREE_SCHEMES",
    "SCHEMES",
    "ClientPartition",
    "natural_id_partition",
    "partition_dataset",
    "plot_partition_heatmap",
    "select_rows",
]

logger = logging.getLogger(__name__)

SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "inner_dirichlet", "pathological", "linear")
#: schemes that split by rows only (a label column, when there is one, is just counted)
LABEL_FREE_SCHEMES: tuple[str, ...] = ("iid", "linear")
_SIZE_PARTITIONERS = {"linear": "LinearPartitioner"}

_ROW = "__row__"
_LABEL = "__label__"


@dataclass(eq=False)
class ClientPartition:
    """The result of partitioning one dataset split into clients.

    Attributes:
        client_indices: one sorted ``int64`` array of row indices (into the partitioned
            dataset) per client. Disjoint across clients.
        label_counts: ``[num_clients, num_classes]`` ``int64`` matrix; row ``i`` counts
            the labels of client ``i`` (columns follow ``class_names``).
        scheme: partitioning scheme (one of :data:`SCHEMES`).
        alpha: Dirichlet concentration for the Dirichlet schemes, else ``None``.
        seed: seed the partition was drawn with.
        class_names: names of the label classes (``ClassLabel.names`` when available).
        classes_per_client: ``k`` of the pathological scheme, else ``None``.
        num_rows: number of rows of the partitioned dataset; used to refuse a dataset
            of another size in :meth:`client_dataset`.
    """

    client_indices: list[np.ndarray]
    label_counts: np.ndarray
    scheme: str
    alpha: float | None
    seed: int
    class_names: list[str]
    classes_per_client: int | None = None
    num_rows: int | None = None
    _sizes: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.client_indices = [np.asarray(idx, dtype=np.int64) for idx in self.client_indices]
        self.label_counts = np.asarray(self.label_counts, dtype=np.int64)
        self.class_names = [str(name) for name in self.class_names]
        expected = (len(self.client_indices), len(self.class_names))
        if self.label_counts.shape != expected:
            raise ConfigError(
                f"label_counts has shape {self.label_counts.shape}, expected "
                f"(num_clients, num_classes) = {expected}"
            )
        self._sizes = [int(idx.size) for idx in self.client_indices]
        if self.label_counts.sum(axis=1).tolist() != self._sizes:
            raise ConfigError("label_counts rows must sum to the client sizes")

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.client_indices)

    @property
    def num_classes(self) -> int:
        """Number of label classes (columns of ``label_counts``)."""
        return len(self.class_names)

    @property
    def num_samples(self) -> list[int]:
        """Per-client number of rows, e.g. as FedAvg aggregation weights."""
        return list(self._sizes)

    def client_dataset(self, dataset: datasets.Dataset, client_id: int) -> datasets.Dataset:
        """The rows of client ``client_id``: ``dataset.select(indices)`` (see :func:`select_rows`).

        ``select`` keeps the dataset's format and transform, so partition the raw (or
        transformed, the labels are read without the transform) dataset once and pass
        the transformed one here.

        Args:
            dataset: the same split that was partitioned (same rows, same order); its
                format/transform may differ.
            client_id: client index in ``[0, num_clients)``.

        Returns:
            The client's dataset (an indices mapping over the same Arrow table, no copy).
        """
        if not 0 <= int(client_id) < self.num_clients:
            raise IndexError(f"client_id={client_id} is out of range [0, {self.num_clients})")
        if self.num_rows is not None and len(dataset) != self.num_rows:
            raise ConfigError(
                f"this partition was made on a dataset of {self.num_rows} rows but got one "
                f"of {len(dataset)} rows: pass the split that was partitioned (e.g. the "
                f"train split, not the test split)"
            )
        return select_rows(dataset, self.client_indices[int(client_id)])

    def client_classes(self, client_id: int) -> list[str]:
        """Names of the classes present on client ``client_id``."""
        present = np.flatnonzero(self.label_counts[int(client_id)])
        return [self.class_names[c] for c in present]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (plain ints/floats/lists); see :meth:`from_dict`."""
        return {
            "scheme": self.scheme,
            "alpha": None if self.alpha is None else float(self.alpha),
            "seed": int(self.seed),
            "classes_per_client": (
                None if self.classes_per_client is None else int(self.classes_per_client)
            ),
            "num_rows": None if self.num_rows is None else int(self.num_rows),
            "class_names": list(self.class_names),
            "client_indices": [idx.tolist() for idx in self.client_indices],
            "label_counts": self.label_counts.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClientPartition:
        """Rebuild a partition from :meth:`to_dict` output (e.g. ``json.load``-ed)."""
        return cls(
            client_indices=[np.asarray(idx, dtype=np.int64) for idx in d["client_indices"]],
            label_counts=np.asarray(d["label_counts"], dtype=np.int64).reshape(
                len(d["client_indices"]), len(d["class_names"])
            ),
            scheme=d["scheme"],
            alpha=d.get("alpha"),
            seed=int(d["seed"]),
            class_names=list(d["class_names"]),
            classes_per_client=d.get("classes_per_client"),
            num_rows=d.get("num_rows"),
        )

    def save_json(self, path: str | Path, *, root: str | Path | None = None) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` (atomically; never through a symbolic link, see
        :func:`hf_fedflat.io.check_write_path` for ``root``); returns the path."""
        from ..io import atomic_write_text

        path = Path(path)
        atomic_write_text(json.dumps(self.to_dict()), path, root=root, durable=False)
        return path

    @classmethod
    def load_json(cls, path: str | Path) -> ClientPartition:
        """Read a partition written by :meth:`save_json`."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def describe_scheme(self) -> str:
        """Short description of the scheme and its parameters, e.g. ``dirichlet(alpha=0.3)``."""
        if self.alpha is not None:
            return f"{self.scheme}(alpha={self.alpha:g})"
        if self.classes_per_client is not None:
            return f"{self.scheme}(classes_per_client={self.classes_per_client})"
        return self.scheme

    def summary(self) -> str:
        """One-paragraph human-readable summary (sizes and classes per client).

        Example output::

            dirichlet(alpha=0.3), seed 42: 20 clients, 1437 samples, 10 classes
              samples per client: min 12 / median 61.5 / max 188
              classes per client: min 2 / median 5.0 / max 9
        """
        sizes = np.asarray(self._sizes)
        classes = (self.label_counts > 0).sum(axis=1)

        def stats(values: np.ndarray) -> str:
            if values.size == 0:
                return "n/a"
            return f"min {values.min()} / median {np.median(values):g} / max {values.max()}"

        return (
            f"{self.describe_scheme()}, seed {self.seed}: {self.num_clients} clients, "
            f"{int(sizes.sum())} samples, {self.num_classes} classes\n"
            f"  samples per client: {stats(sizes)}\n"
            f"  classes per client: {stats(classes)}"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClientPartition):
            return NotImplemented
        return (
            self.scheme == other.scheme
            and self.alpha == other.alpha
            and self.seed == other.seed
            and self.class_names == other.class_names
            and self.classes_per_client == other.classes_per_client
            and self.num_rows == other.num_rows
            and self.num_clients == other.num_clients
            and np.array_equal(self.label_counts, other.label_counts)
            and all(np.array_equal(a, b) for a, b in zip(self.client_indices, other.client_indices))
        )

    __hash__ = None  # mutable, holds arrays


def _read_labels(dataset: datasets.Dataset, label_column: str) -> tuple[np.ndarray, list[str]]:
    """Label ids (int64, ``[n]``) and class names, read without running any transform."""
    if label_column not in dataset.column_names:
        raise ConfigError(
            f"label_column={label_column!r} is not a column of the dataset "
            f"(columns: {dataset.column_names}); pass the name of the label column"
        )
    feature = dataset.features[label_column]
    # with_format("numpy") replaces any transform: only the label column is read.
    if isinstance(feature, (datasets.Sequence, datasets.List, datasets.LargeList)):
        raise ConfigError(
            f"partition_scheme: it splits the rows by class, but label_column={label_column!r} holds a sequence per "
            "row (a language model's or a tagger's labels): use --partition_scheme iid or linear, or --partition_by "
            "<a column of ids>.")
    # Format the whole column at once: datasets 4's lazy column is read row by row otherwise (~10x slower).
    values = np.asarray(dataset.select_columns([label_column]).with_format("numpy")[:][label_column])
    if values.ndim != 1:
        raise ConfigError(
            f"label_column={label_column!r} must hold one scalar label per row, got "
            f"values of shape {values.shape}"
        )
    if isinstance(feature, datasets.ClassLabel):
        ids = values.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= feature.num_classes):
            raise ConfigError(
                f"label_column={label_column!r} has ids outside [0, {feature.num_classes}) "
                f"(e.g. -1 for missing labels); filter those rows out before partitioning"
            )
        return ids, list(feature.names)
    uniques, ids = np.unique(values, return_inverse=True)
    return ids.astype(np.int64).reshape(-1), [str(u) for u in uniques]


def _read_labels_if_any(dataset: datasets.Dataset, label_column: str) -> tuple[np.ndarray, list[str]]:
    """Labels as :func:`_read_labels` when the column holds one scalar per row; otherwise (no such column, or
    sequence labels as a language model's) every row in one class ``"all"``."""
    feature = dataset.features.get(label_column)
    if isinstance(feature, (datasets.ClassLabel, datasets.Value)):
        return _read_labels(dataset, label_column)
    return np.zeros(len(dataset), dtype=np.int64), ["all"]


def natural_id_partition(dataset: datasets.Dataset, partition_by: str, *, label_column: str = "label") -> ClientPartition:
    """One client per value of ``partition_by`` (a user, speaker or device id), with flwr-datasets'
    ``NaturalIdPartitioner``: every row belongs to the client of its id, so the clients are complete and disjoint.

    Clients are numbered in flwr's order (the ids' strings sorted); ``class_names`` count the label
    column when it holds one scalar per row (else one class ``"all"``). ``scheme`` is ``"natural_id"``.

    Raises:
        ValueError: ``partition_by`` is not a column, or holds a missing (null) id.
    """
    if partition_by not in dataset.column_names:
        raise ConfigError(f"partition_by: {partition_by!r} is not a column of the dataset (columns: {dataset.column_names}).")
    n = len(dataset)
    if n == 0:
        raise ConfigError("dataset is empty: nothing to partition")
    # The whole column in one formatted batch: datasets 4's lazy column is read row by row otherwise (765k FEMNIST
    # rows: 95 s instead of under a second).
    ids_column = dataset.select_columns([partition_by]).with_format(None)[:][partition_by]
    if any(v is None for v in ids_column):
        raise ConfigError(f"partition_by: {partition_by!r} has missing (null) ids; fill or drop those rows first.")
    ids, class_names = _read_labels_if_any(dataset, label_column)
    client_indices = _natural_id_indices([str(v) for v in ids_column])
    owner = np.full(n, -1, dtype=np.int64)
    for client, idx in enumerate(client_indices):
        owner[idx] = client
    if (owner < 0).any():  # flwr's contract; checked because a lost row would be silently untrained
        raise RuntimeError(f"natural-id partition left {int((owner < 0).sum())} rows without a client")
    num_clients = len(client_indices)
    label_counts = np.bincount(owner * len(class_names) + ids, minlength=num_clients * len(class_names))
    return ClientPartition(client_indices=client_indices,
                           label_counts=label_counts.reshape(num_clients, len(class_names)), scheme="natural_id",
                           alpha=None, seed=0, class_names=class_names, num_rows=n)


def _natural_id_indices(ids: list[str]) -> list[np.ndarray]:
    """Each id's rows (ascending), the ids in flwr-datasets' ``NaturalIdPartitioner`` order (``sorted`` strings).

    The same clients as ``NaturalIdPartitioner.load_partition(pid)`` for every ``pid`` (tested against it), in
    one sort instead of a ``Dataset.select`` per client (3,400 FEMNIST writers: seconds instead of minutes).
    """
    names, owner = np.unique(np.asarray(ids, dtype=str), return_inverse=True)  # code-point order, as sorted()
    rows = np.argsort(owner, kind="stable").astype(np.int64)  # grouped by client, row order kept in each
    counts = np.bincount(owner, minlength=len(names))
    return np.split(rows, np.cumsum(counts)[:-1])


def _check_int(name: str, value: Any, low: int, high: int | None, fix: str) -> int:
    """``value`` as an int in ``[low, high]``; else a ``ConfigError`` (a ``ValueError``) that starts with ``name``, the
    flag's name: the bounds come from the data (its rows, its classes), so the command line reports the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        fail(name, f"must be an int, got {value!r}.")
    value = int(value)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        fail(name, f"{value} must be {bounds}; {fix}.")
    return value


def partition_dataset(
    dataset: datasets.Dataset,
    num_clients: int,
    scheme: str = "dirichlet",
    *,
    label_column: str = "label",
    alpha: float = 0.3,
    classes_per_client: int = 2,
    min_partition_size: int = 2,
    seed: int = 42,
    self_balancing: bool = False,
) -> ClientPartition:
    """Split ``dataset`` into ``num_clients`` disjoint clients with a flwr-datasets partitioner.

    Only ``label_column`` is read (with any transform bypassed), so passing a dataset
    with an image transform set costs nothing extra. The same arguments and the same
    dataset always give the same partition.

    Args:
        dataset: one split (``datasets.Dataset``, not a ``DatasetDict``).
        num_clients: number of clients, in ``[1, len(dataset)]``.
        scheme: ``"iid"``, ``"dirichlet"``, ``"inner_dirichlet"`` or ``"pathological"``
            (see the module docstring).
        label_column: column with the class labels (``ClassLabel`` or any scalar values).
        alpha: Dirichlet concentration (> 0) for the Dirichlet schemes; smaller is more
            heterogeneous. Ignored by ``"iid"`` and ``"pathological"``.
        classes_per_client: number of classes per client for ``"pathological"``, in
            ``[1, number of classes present]``.
        min_partition_size: every client gets at least this many rows; ``"dirichlet"``
            redraws to meet it, the other schemes raise if their sizes fall short.
        seed: seed of the partitioner's random generator.
        self_balancing: ``"dirichlet"`` only: stop giving rows to clients that already
            hold more than ``len(dataset) / num_clients`` (the balancing of the original
            code and FedML; flwr's default and ours is off).

    Returns:
        A :class:`ClientPartition`.

    Raises:
        ValueError: bad arguments (the message names the argument and the fix), or a
            partition that cannot meet ``min_partition_size``.

    Example:
        >>> from hf_fedflat.data import load_digits_dataset, partition_dataset
        >>> train = load_digits_dataset()["train"]
        >>> part = partition_dataset(train, num_clients=20, scheme="dirichlet", alpha=0.3)
        >>> client0 = part.client_dataset(train, 0)  # keeps the transform
    """
    if isinstance(dataset, datasets.DatasetDict):
        raise TypeError(
            f"partition_dataset takes one split, got a DatasetDict with splits "
            f"{list(dataset)}; pass e.g. dataset['train']"
        )
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"dataset must be a datasets.Dataset, got {type(dataset).__name__}")
    if scheme not in SCHEMES:
        raise ConfigError(f"scheme={scheme!r} is unknown; choose one of {list(SCHEMES)}")
    n = len(dataset)
    if n == 0:
        raise ConfigError("dataset is empty: nothing to partition")
    num_clients = _check_int(
        "num_clients", num_clients, 1, n,
        f"the training data has {n} rows, and every client needs one: use at most {n} clients",
    )
    min_partition_size = _check_int(
        "min_partition_size", min_partition_size, 0, None, "use 0 for no minimum"
    )
    if num_clients * min_partition_size > n:
        fail("min_partition_size",
             f"{min_partition_size} is impossible with num_clients={num_clients} and {n} rows (needs "
             f"{num_clients * min_partition_size}); lower min_partition_size to at most {n // num_clients} or use "
             "fewer clients.")
    uses_alpha = scheme in ("dirichlet", "inner_dirichlet")
    if uses_alpha:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer)):
            raise ConfigError(f"alpha must be a number > 0, got {alpha!r}")
        if not np.isfinite(alpha) or alpha <= 0:
            raise ConfigError(
                f"alpha={alpha} must be a finite number > 0 (Dirichlet concentration; "
                f"e.g. 0.1 very skewed, 0.3 skewed, 100 nearly IID)"
            )
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ConfigError(f"seed must be an int, got {seed!r}")

    ids, class_names = (_read_labels_if_any if scheme in LABEL_FREE_SCHEMES else _read_labels)(dataset, label_column)
    present = np.unique(ids)
    if scheme == "pathological":
        classes_per_client = _check_int(
            "classes_per_client", classes_per_client, 1, len(present),
            f"the dataset has {len(present)} classes present"
            f" (of {len(class_names)}); pick a value in that range",
        )

    # Partitioners see encoded labels 0..P-1 (InnerDirichletPartitioner assumes labels are
    # exactly range(num_unique)) and the original row id, nothing else.
    codes = np.searchsorted(present, ids).astype(np.int64)
    rows = np.arange(n, dtype=np.int64)
    if scheme in LABEL_FREE_SCHEMES:  # flwr cuts contiguous slices: shuffle first
        rows = np.random.default_rng(seed).permutation(n).astype(np.int64)
        codes = codes[rows]
    small = datasets.Dataset.from_dict({_LABEL: codes, _ROW: rows}).with_format("numpy")
    partitioner = _make_partitioner(
        scheme, num_clients, n, alpha=alpha, classes_per_client=classes_per_client,
        min_partition_size=min_partition_size, seed=int(seed), self_balancing=self_balancing,
    )
    partitioner.dataset = small
    client_indices = _run_partitioner(
        partitioner, scheme, num_clients, alpha, min_partition_size, classes_per_client
    )

    sizes = np.array([idx.size for idx in client_indices])
    if sizes.min() < min_partition_size:
        raise ConfigError(
            f"scheme={scheme!r} gave a client {sizes.min()} rows, below "
            f"min_partition_size={min_partition_size}; lower min_partition_size or use "
            f"fewer clients"
        )
    owner = np.full(n, -1, dtype=np.int64)
    for client, idx in enumerate(client_indices):
        owner[idx] = client
    used = owner >= 0
    label_counts = np.bincount(
        owner[used] * len(class_names) + ids[used], minlength=num_clients * len(class_names)
    ).reshape(num_clients, len(class_names))
    if not used.all():
        logger.warning(
            "partition %s left %d of %d rows unassigned", scheme, int((~used).sum()), n
        )
    return ClientPartition(
        client_indices=client_indices,
        label_counts=label_counts,
        scheme=scheme,
        alpha=float(alpha) if uses_alpha else None,
        seed=int(seed),
        class_names=class_names,
        classes_per_client=classes_per_client if scheme == "pathological" else None,
        num_rows=n,
    )


def _make_partitioner(
    scheme: str, num_clients: int, n: int, *, alpha: float, classes_per_client: int,
    min_partition_size: int, seed: int, self_balancing: bool,
):
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        InnerDirichletPartitioner,
        PathologicalPartitioner,
    )

    # shuffle=False everywhere: it only reorders rows inside a client, which we sort anyway.
    if scheme == "iid":
        return IidPartitioner(num_partitions=num_clients)
    if scheme in _SIZE_PARTITIONERS:
        import flwr_datasets.partitioner as partitioners

        return getattr(partitioners, _SIZE_PARTITIONERS[scheme])(num_partitions=num_clients)
    if scheme == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_clients, partition_by=_LABEL, alpha=float(alpha),
            min_partition_size=min_partition_size, self_balancing=self_balancing,
            shuffle=False, seed=seed,
        )
    if scheme == "inner_dirichlet":
        sizes = [n // num_clients + (1 if i < n % num_clients else 0) for i in range(num_clients)]
        return InnerDirichletPartitioner(
            partition_sizes=sizes, partition_by=_LABEL, alpha=float(alpha),
            shuffle=False, seed=seed,
        )
    return PathologicalPartitioner(
        num_partitions=num_clients, partition_by=_LABEL,
        num_classes_per_partition=classes_per_client,
        class_assignment_mode="first-deterministic", shuffle=False, seed=seed,
    )


def _run_partitioner(
    partitioner, scheme: str, num_clients: int, alpha: float, min_partition_size: int,
    classes_per_client: int,
) -> list[np.ndarray]:
    """Load every partition and return the sorted original row ids of each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = []
            for pid in range(num_clients):
                part = partitioner.load_partition(pid)
                out.append(np.sort(np.asarray(part[:][_ROW], dtype=np.int64)))
        except ValueError as err:
            msg = str(err)
            if scheme == "dirichlet" and "max number of attempts" in msg:
                raise ConfigError(
                    f"dirichlet partition could not give each of the {num_clients} clients "
                    f"min_partition_size={min_partition_size} rows with alpha={alpha} in 11 "
                    f"draws; lower min_partition_size, raise alpha or use fewer clients"
                ) from err
            if scheme == "inner_dirichlet" and "NaN" in msg:
                raise ConfigError(
                    f"inner_dirichlet partition failed with alpha={alpha}: a client's class "
                    f"prior put all its mass on classes already used up (happens for very "
                    f"small alpha); raise alpha (e.g. >= 0.05) or change the seed"
                ) from err
            if scheme == "pathological":
                msg = msg.split(" Please ")[0].rstrip(".")  # drop advice naming flwr-only options
                raise ConfigError(
                    f"pathological partition with num_clients={num_clients} and "
                    f"classes_per_client={classes_per_client} failed: {msg}; lower num_clients or "
                    f"classes_per_client"
                ) from err
            raise
    retries = sum("min_partition_size" in str(w.message) for w in caught)
    if retries:
        logger.info(
            "dirichlet partition redrew %d time(s) to give every client >= %d rows",
            retries, min_partition_size,
        )
    for w in caught:
        if "min_partition_size" in str(w.message) or issubclass(w.category, RuntimeWarning):
            continue
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out


def plot_partition_heatmap(
    partition: ClientPartition,
    path: str | Path,
    title: str | None = None,
    *,
    annotate: bool | None = None,
    dpi: int = 120,
    root: str | Path | None = None,
) -> Path:
    """Save a heatmap of ``partition.label_counts`` (classes x clients) as a PNG.

    Clients run along the x axis, classes along the y axis; a bar on top shows each
    client's size. Drawn with matplotlib's object API and the Agg canvas (no pyplot, no
    global backend change, safe in headless runs and threads).
    ``flwr_datasets.visualization.plot_label_distributions`` is not used because it
    needs the live partitioner and reloads every partition; this works from the
    saved counts alone (e.g. a partition restored from a checkpoint).

    Args:
        partition: the partition to draw.
        path: output file (``.png``); parent folders are created.
        title: figure title; defaults to the scheme and its parameters.
        annotate: write the count in each cell; by default only when there are at most
            50 clients and 30 classes (beyond that the numbers are unreadable).
        dpi: resolution.
        root: the run's folder: written atomically, never through a symbolic link at ``path`` or in a folder
            below ``root`` (:func:`hf_fedflat.io.check_write_path`).

    Returns:
        The path written, as a ``Path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = partition.label_counts
    num_clients, num_classes = counts.shape
    if annotate is None:
        annotate = num_clients <= 50 and num_classes <= 30
    width = float(np.clip(1.5 + 0.4 * num_clients, 6.0, 24.0))
    height = float(np.clip(2.5 + 0.3 * num_classes, 4.0, 16.0))
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2, height_ratios=(1, 4), width_ratios=(40, 1))
    ax_bar = fig.add_subplot(grid[0, 0])
    ax = fig.add_subplot(grid[1, 0], sharex=ax_bar)
    cax = fig.add_subplot(grid[1, 1])

    image = ax.imshow(
        counts.T, aspect="auto", cmap="viridis", interpolation="nearest",
        extent=(-0.5, num_clients - 0.5, num_classes - 0.5, -0.5),
    )
    fig.colorbar(image, cax=cax, label="samples")
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    if num_classes <= 30:
        ax.set_yticks(range(num_classes), partition.class_names)
    if num_clients <= 50:
        ax.set_xticks(range(num_clients))
        ax.tick_params(axis="x", labelsize=8 if num_clients > 25 else 10)
    if annotate:
        threshold = counts.max() / 2 if counts.size else 0
        for client in range(num_clients):
            for cls in range(num_classes):
                value = int(counts[client, cls])
                if value:
                    ax.text(
                        client, cls, str(value), ha="center", va="center", fontsize=7,
                        color="black" if value > threshold else "white",
                    )
    if num_clients <= 200:
        ax_bar.bar(range(num_clients), counts.sum(axis=1), color="0.4", width=0.8)
    else:  # one artist, not one patch per client (3,400 bars: ~1 min to draw)
        ax_bar.stairs(counts.sum(axis=1), np.arange(num_clients + 1) - 0.5, fill=True, color="0.4")
    ax_bar.set_ylabel("size")
    ax_bar.tick_params(axis="x", labelbottom=False)
    fig.suptitle(
        title if title is not None
        else f"{partition.describe_scheme()}: {num_clients} clients, seed {partition.seed}"
    )
    from ..io import atomic_savefig

    return atomic_savefig(fig, Path(path), root=root)
