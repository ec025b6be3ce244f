"""LEAF's JSON format: a reader (one file at a time, validated) and a writer (for ``--smoke`` and tests).

LEAF (Caldas et al. 2018, https://leaf.cmu.edu/, ``TalwalkarLab/leaf``) stores every dataset (FEMNIST,
CelebA, Synthetic, Sent140, Reddit, Shakespeare) the same way: a folder ``train/`` and a folder ``test/``
(LEAF's own tree: ``data/<dataset>/data/{train,test}``), each with one or more ``*.json`` files::

    {"users": ["f0000_14", ...],                 # the clients of this file, in order
     "num_samples": [226, ...],                  # samples per user, same order
     "user_data": {"f0000_14": {"x": [...], "y": [...]}, ...},
     "hierarchies": [...]}                       # optional: one entry per user (e.g. a user's group)

LEAF's ``split_data.py`` splits either by sample (``--by_sample``, the default of the papers: every user in
both folders, its samples divided) or by user (``--by_user``: a user is in one folder only). :func:`read_leaf`
accepts both and refuses anything else (a user in ``test`` only when most users are in both, a user twice in
one split).

Streaming: files are parsed one at a time (with ``orjson`` when it is installed: ~3x faster than ``json``) and
each user's ``x``/``y`` is handed to a ``convert`` callback right away (e.g. FEMNIST's 784 floats per image -> one
``uint8`` array per user), so at most one file's Python lists are alive at once, whatever the number of users
(FEMNIST: ~3,500 writers in ~36 files).

Validation (every message names the file): the three keys present; ``users`` and ``num_samples`` of one length
(and ``hierarchies`` when given); ``user_data`` keyed by exactly ``users``; ``num_samples[i] == len(x) ==
len(y)`` for every user; no user twice in a split; users consistent between ``train`` and ``test``.

Interface::

    data = read_leaf(root, convert=lambda user, x, y: (np.asarray(x, np.float32), np.asarray(y)))
    data.users                      # train users in file order (then test-only users when split by user)
    # rows grouped by user -> their natural partition (ClientPartition) in milliseconds:
    partition = contiguous_partition(sizes_per_user, labels_per_row, class_names)
    data.train["f0000_14"]          # convert's result for that user's train samples
    data.num_samples["test"][user]  # LEAF's count
    write_leaf(root, "train", {"u0": (x, y), ...}, num_files=2)   # the same format back
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from ..field_checks import ConfigError

__all__ = [
    "LEAF_SPLITS",
    "LeafData",
    "LeafFormatError",
    "LeafClients",
    "LeafUser",
    "choose_users",
    "contiguous_partition",
    "iter_leaf_users",
    "leaf_split_files",
    "natural_clients_from_rows",
    "read_leaf",
    "resolve_leaf_root",
    "split_by_sample",
    "write_leaf",
]

LEAF_SPLITS = ("train", "test")
_REQUIRED_KEYS = ("users", "num_samples", "user_data")


class LeafFormatError(ValueError):
    """A LEAF JSON file (or folder) that does not follow the format; the message names the file."""


@dataclass
class LeafUser:
    """One user of one LEAF file: its samples as stored (``x`` and ``y`` lists), its hierarchy entry
    (``None`` without ``hierarchies``), LEAF's ``num_samples`` and the file it came from."""

    user: str
    x: list
    y: list
    num_samples: int
    hierarchy: Any
    path: Path


@dataclass
class LeafData:
    """What :func:`read_leaf` read: per split, user -> ``convert(user, x, y)``, in file order.

    Attributes:
        users: every user, train users first in file order (with a by-sample split, the same users as test).
        train, test: user -> converted samples (a user missing from a split is absent from its dict).
        num_samples: ``{"train": {user: n}, "test": {user: n}}`` as LEAF's files state them (checked).
        hierarchies: user -> hierarchy entry, for files that carry ``hierarchies`` (else empty).
        split_by: ``"sample"`` (every user in both splits) or ``"user"`` (disjoint users).
        files: ``{"train": [paths], "test": [paths]}`` read, in order.
    """

    users: list[str]
    train: dict[str, Any]
    test: dict[str, Any]
    num_samples: dict[str, dict[str, int]]
    hierarchies: dict[str, Any] = field(default_factory=dict)
    split_by: str = "sample"
    files: dict[str, list[Path]] = field(default_factory=dict)

    def split(self, name: str) -> dict[str, Any]:
        """``train`` or ``test``."""
        if name not in LEAF_SPLITS:
            raise KeyError(f"split must be one of {LEAF_SPLITS}, got {name!r}")
        return self.train if name == "train" else self.test


def _natural_key(path: Path) -> list:
    """File order ``..._2.json`` before ``..._10.json`` (LEAF numbers its files)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def resolve_leaf_root(root: str | Path) -> Path:
    """The folder holding ``train/`` and ``test/``: ``root`` itself, or LEAF's ``root/data`` (``data/<dataset>``)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data_dir={str(root)!r} is not an existing folder; pass the LEAF folder holding "
                                "train/*.json and test/*.json (LEAF: data/<dataset>/data).")
    for candidate in (root, root / "data"):
        if (candidate / "train").is_dir():
            return candidate
    raise FileNotFoundError(
        f"data_dir={str(root)!r} has no train/ folder of LEAF JSON files (looked in {root} and {root / 'data'}); "
        "pass the folder holding train/*.json and test/*.json (LEAF: data/<dataset>/data after preprocess.sh).")


def leaf_split_files(root: str | Path, split: str) -> list[Path]:
    """The ``*.json`` files of ``root/<split>/``, in LEAF's numeric order; an error when there are none."""
    if split not in LEAF_SPLITS:
        raise ConfigError(f"split must be one of {LEAF_SPLITS}, got {split!r}")
    folder = Path(root) / split
    files = sorted(folder.glob("*.json"), key=_natural_key) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{folder}: no LEAF *.json files (expected {split}/*.json beside "
                                f"{'test' if split == 'train' else 'train'}/ in {root}).")
    return files


def _json_loads() -> tuple[Callable[[bytes], Any], tuple[type[BaseException], ...]]:
    """``orjson.loads`` when orjson is installed (about 3x faster on LEAF's float lists), else ``json.loads``."""
    try:
        import orjson
    except ImportError:
        return json.loads, (json.JSONDecodeError, UnicodeDecodeError)
    return orjson.loads, (orjson.JSONDecodeError, UnicodeDecodeError)


def _load_file(path: Path) -> dict:
    loads, errors = _json_loads()
    try:
        content = loads(Path(path).read_bytes())
    except errors as err:
        raise LeafFormatError(f"{path}: not valid JSON ({err}).") from err
    if not isinstance(content, dict):
        raise LeafFormatError(f"{path}: a LEAF file is a JSON object with users, num_samples, user_data; "
                              f"got a {type(content).__name__}.")
    missing = [key for key in _REQUIRED_KEYS if key not in content]
    if missing:
        raise LeafFormatError(f"{path}: missing key(s) {missing}; a LEAF file has {list(_REQUIRED_KEYS)} "
                              "(and optionally hierarchies).")
    users, counts, user_data = content["users"], content["num_samples"], content["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or not isinstance(user_data, dict):
        raise LeafFormatError(f"{path}: users and num_samples must be lists and user_data an object.")
    if len(users) != len(counts):
        raise LeafFormatError(f"{path}: {len(users)} users but {len(counts)} num_samples entries.")
    if len(set(users)) != len(users):
        seen, dup = set(), None
        for user in users:
            if user in seen:
                dup = user
                break
            seen.add(user)
        raise LeafFormatError(f"{path}: user {dup!r} is listed twice in users.")
    if set(map(str, user_data)) != set(map(str, users)):
        extra = sorted(set(map(str, user_data)) - set(map(str, users)))[:3]
        lacking = sorted(set(map(str, users)) - set(map(str, user_data)))[:3]
        raise LeafFormatError(f"{path}: user_data and users name different users (in user_data only: {extra}; "
                              f"in users only: {lacking}).")
    hierarchies = content.get("hierarchies")
    if hierarchies is not None and (not isinstance(hierarchies, list) or len(hierarchies) != len(users)):
        raise LeafFormatError(f"{path}: hierarchies must be a list with one entry per user ({len(users)}).")
    return content


def _read_users(path: Path) -> list[str]:
    """The ``users`` list of a LEAF file without parsing its samples when ``users`` is the file's first key (as
    LEAF writes it): only the array at the head of the file is decoded. Otherwise the whole file is read."""
    with open(path, "rb") as handle:
        head = handle.read(1 << 20)
    key = head.find(b'"users"')
    if key >= 0 and head[:key].strip() == b"{":
        start = head.find(b"[", key)
        colon = head[key + len(b'"users"'):start].strip() if start >= 0 else b""
        if colon == b":":
            try:
                users, _ = json.JSONDecoder().raw_decode(head[start:].decode("utf-8", errors="ignore"))
            except json.JSONDecodeError:  # the array continues past the first MiB
                users = None
            if isinstance(users, list):
                return [str(user) for user in users]
    return [str(user) for user in _load_file(path)["users"]]


def iter_leaf_users(root: str | Path, split: str, *, files: Sequence[Path] | None = None,
                    check_num_samples: bool = True) -> Iterator[LeafUser]:
    """Every user of ``root/<split>/*.json``, file by file, validated (see the module docstring).

    ``check_num_samples=False``: ``len(x) == len(y)`` is still required but ``num_samples`` may differ from it
    (LEAF Reddit's files state each user's total count in every split); it is recorded as stated.

    Only the current file is held in memory; a caller that converts each :class:`LeafUser` and drops it keeps
    at most one file's lists alive.

    Raises:
        LeafFormatError: a malformed file, or a user already seen in an earlier file of this split.
        FileNotFoundError: no ``*.json`` in ``root/<split>``.
    """
    files = list(files) if files is not None else leaf_split_files(root, split)
    seen: dict[str, Path] = {}
    for path in files:
        content = _load_file(path)
        hierarchies = content.get("hierarchies")
        user_data = content["user_data"]
        for i, (user, count) in enumerate(zip(content["users"], content["num_samples"])):
            user = str(user)
            if user in seen:
                raise LeafFormatError(f"{path}: user {user!r} is also in {seen[user]} (a user appears in one "
                                      f"{split} file only).")
            seen[user] = path
            rows = user_data[user]
            if not isinstance(rows, dict) or "x" not in rows or "y" not in rows:
                raise LeafFormatError(f"{path}: user_data[{user!r}] must be an object with x and y.")
            x, y = rows["x"], rows["y"]
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise LeafFormatError(f"{path}: num_samples of user {user!r} must be an integer >= 0, got {count!r}.")
            if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y) or (
                    check_num_samples and len(x) != count):
                lx = len(x) if isinstance(x, list) else type(x).__name__
                ly = len(y) if isinstance(y, list) else type(y).__name__
                raise LeafFormatError(f"{path}: user {user!r} has num_samples {count} but len(x) = {lx} and "
                                      f"len(y) = {ly} (all three must be equal).")
            yield LeafUser(user, x, y, count, None if hierarchies is None else hierarchies[i], path)
        del content, user_data


def read_leaf(
    root: str | Path,
    convert: Callable[[str, list, list], Any] | None = None,
    *,
    splits: Sequence[str] = LEAF_SPLITS,
    keep_users: Callable[[list[str]], Sequence[str]] | None = None,
    check_num_samples: bool = True,
) -> LeafData:
    """Read a LEAF dataset folder (``train/*.json`` and ``test/*.json``; or LEAF's ``data/`` above them).

    Args:
        root: the folder (see :func:`resolve_leaf_root`).
        convert: ``(user, x, y) -> value`` applied to each user's samples as soon as its file is parsed
            (default: the ``(x, y)`` lists as stored). Return compact arrays to keep memory low.
        splits: the splits to read (``("train",)`` reads no test folder).
        keep_users: optional ``train users -> users to keep`` (e.g. a seeded ``max_clients`` draw): the user ids
            of every file are read first (only the head of each file when ``users`` is its first key, as LEAF
            writes it), the samples of the other users are never converted.
        check_num_samples: ``False`` accepts ``num_samples`` that differ from ``len(x)`` (LEAF Reddit states each
            user's total count in every split); ``len(x) == len(y)`` is always required.

    Returns:
        A :class:`LeafData`.

    Raises:
        LeafFormatError: a malformed file (named), or train/test users inconsistent: with a by-sample split every
            user is in both folders, with a by-user split in one; a partial overlap is refused.
    """
    root = resolve_leaf_root(root)
    convert = convert or (lambda user, x, y: (x, y))
    files = {split: leaf_split_files(root, split) for split in splits}
    wanted: set[str] | None = None
    if keep_users is not None:
        train_users = [user for path in files["train"] for user in _read_users(path)]
        wanted = set(map(str, keep_users(train_users)))
    out: dict[str, dict[str, Any]] = {split: {} for split in LEAF_SPLITS}
    counts: dict[str, dict[str, int]] = {split: {} for split in LEAF_SPLITS}
    hierarchies: dict[str, Any] = {}
    for split in splits:
        for item in iter_leaf_users(root, split, files=files[split], check_num_samples=check_num_samples):
            counts[split][item.user] = item.num_samples
            if wanted is not None and item.user not in wanted:
                continue
            if item.hierarchy is not None:
                hierarchies.setdefault(item.user, item.hierarchy)
            try:
                out[split][item.user] = convert(item.user, item.x, item.y)
            except (ValueError, TypeError) as err:
                raise LeafFormatError(f"{item.path}: user {item.user!r}: {err}") from err
    split_by = "sample"
    if "train" in splits and "test" in splits:
        train, test = set(counts["train"]), set(counts["test"])
        if train != test:
            if train & test:
                only_train = sorted(train - test)[:3]
                only_test = sorted(test - train)[:3]
                raise LeafFormatError(
                    f"{root}: train and test share {len(train & test)} users but {len(train - test)} are only in "
                    f"train/ (e.g. {only_train}) and {len(test - train)} only in test/ (e.g. {only_test}); LEAF splits "
                    "by sample (the same users in both) or by user (disjoint users). Re-run LEAF's split_data.py or "
                    "pass matching folders.")
            split_by = "user"
    users = list(out["train"]) + [user for user in out["test"] if user not in out["train"]]
    return LeafData(users=users, train=out["train"], test=out["test"], num_samples=counts, hierarchies=hierarchies,
                    split_by=split_by, files=files)


def write_leaf(
    root: str | Path,
    split: str,
    user_data: Mapping[str, tuple[Sequence, Sequence]],
    *,
    num_files: int = 1,
    hierarchies: Mapping[str, Any] | None = None,
    prefix: str = "all_data",
) -> list[Path]:
    """Write ``{user: (x, y)}`` as LEAF JSON files ``root/<split>/<prefix>_<i>_<split>.json``.

    Users are dealt to ``num_files`` files in order (contiguous chunks, as LEAF's ``preprocess`` writes them).
    ``x``/``y`` may be numpy arrays (written as lists). Returns the paths written.
    """
    import numpy as np

    if split not in LEAF_SPLITS:
        raise ConfigError(f"split must be one of {LEAF_SPLITS}, got {split!r}")
    if isinstance(num_files, bool) or not isinstance(num_files, int) or num_files < 1:
        raise ConfigError(f"num_files must be an integer >= 1, got {num_files!r}")
    folder = Path(root) / split
    folder.mkdir(parents=True, exist_ok=True)
    users = list(user_data)
    chunks = np.array_split(np.arange(len(users)), min(num_files, max(len(users), 1)))

    def plain(values):
        return values.tolist() if isinstance(values, np.ndarray) else list(values)

    paths = []
    for i, chunk in enumerate(chunks):
        names = [users[j] for j in chunk]
        content: dict[str, Any] = {
            "users": names,
            "num_samples": [len(user_data[u][1]) for u in names],
            "user_data": {u: {"x": plain(user_data[u][0]), "y": plain(user_data[u][1])} for u in names},
        }
        if hierarchies is not None:
            content["hierarchies"] = [hierarchies[u] for u in names]
        path = folder / f"{prefix}_{i}_{split}.json"
        path.write_text(json.dumps(content))
        paths.append(path)
    return paths


def contiguous_partition(sizes: Sequence[int], labels: Any, class_names: Sequence[str], *,
                         scheme: str = "natural", seed: int = 0):
    """The natural :class:`~hf_fedflat.data.partition.ClientPartition` of rows stored grouped by user: client ``i``
    owns the ``sizes[i]`` rows after those of clients ``0..i-1`` (how the LEAF loaders lay out their datasets).

    ``labels``: int class id per row (``len == sum(sizes)``), counted per client over ``class_names``; ``None``
    counts every row in one class ``"all"`` (e.g. next-token data). Vectorised: 3,400 clients in milliseconds.
    """
    import numpy as np

    from .partition import ClientPartition

    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.ndim != 1 or (sizes < 0).any():
        raise ConfigError("sizes must be a 1-D sequence of counts >= 0")
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    total = int(bounds[-1])
    if labels is None:
        labels, class_names = np.zeros(total, dtype=np.int64), ["all"]
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape != (total,):
        raise ConfigError(f"labels must have one entry per row ({total}), got shape {labels.shape}")
    num_classes = len(class_names)
    if total and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(f"labels must be class ids in [0, {num_classes})")
    owner = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    counts = np.bincount(owner * num_classes + labels, minlength=len(sizes) * num_classes)
    rows = np.arange(total, dtype=np.int64)
    return ClientPartition(client_indices=[rows[bounds[i]:bounds[i + 1]] for i in range(len(sizes))],
                           label_counts=counts.reshape(len(sizes), num_classes), scheme=scheme, alpha=None,
                           seed=int(seed), class_names=list(class_names), num_rows=total)


@dataclass(eq=False)
class LeafClients:
    """A LEAF dataset split into its natural clients (one per user: writer, celebrity, ...).

    Attributes:
        dataset: ``DatasetDict`` with ``train`` and ``test``; rows grouped by client (client ``i``'s rows after
            those of ``0..i-1``), each with an int ``client_id`` column; no transform set.
        partition: the natural partition of ``dataset["train"]`` (client ``i`` = ``users[i]``).
        test_partition: the same for ``dataset["test"]`` (LEAF's per-user test samples).
        users: LEAF's user id of each client.
    """

    dataset: Any
    partition: Any
    test_partition: Any
    users: list[str]

    @property
    def num_clients(self) -> int:
        return len(self.users)


def choose_users(users: Sequence[str], max_clients: int | None, seed: int) -> list[str]:
    """``max_clients`` of ``users`` drawn with ``seed`` (kept in their order); all of them without a limit."""
    import numpy as np

    users = list(users)
    if max_clients is None or max_clients >= len(users):
        return users
    keep = np.sort(np.random.default_rng(seed).choice(len(users), size=int(max_clients), replace=False))
    return [users[i] for i in keep]


def split_by_sample(num_samples: int, train_fraction: float, rng) -> tuple[Any, Any] | None:
    """LEAF's ``split_data.py --by_sample`` for one user: ``(train_rows, test_rows)`` (sorted positions), or
    ``None`` for a user with fewer than 2 samples (LEAF drops it). ``max(1, int(train_fraction * n))`` samples
    train (1 when ``n == 2``, and at most ``n - 1``), drawn with ``rng`` (a numpy Generator); the rest test."""
    import numpy as np

    if num_samples < 2:
        return None
    num_train = 1 if num_samples == 2 else min(num_samples - 1, max(1, int(train_fraction * num_samples)))
    order = rng.permutation(num_samples)
    return np.sort(order[:num_train]), np.sort(order[num_train:])


def natural_clients_from_rows(
    dataset: Any,
    *,
    client_column: str,
    label_ids: Any,
    class_names: Sequence[str],
    keep_columns: Sequence[str],
    train_fraction: float = 0.9,
    max_clients: int | None = None,
    min_samples: int = 2,
    seed: int = 0,
) -> LeafClients:
    """LEAF's clients from a flat dataset (a Hub copy: one row per sample, a column naming its user).

    One client per value of ``client_column`` (sorted ids; users with fewer than ``min_samples`` rows dropped,
    ``max_clients``: a seeded draw), each user's rows split with :func:`split_by_sample` (LEAF's
    ``--by_sample``; one generator seeded with ``seed`` for all users, in order). The result keeps
    ``keep_columns`` of ``dataset`` (e.g. the image column, decoded lazily) plus ``client_id``, the user id
    under ``client_column`` and ``label`` (``label_ids``, a ``ClassLabel`` of ``class_names``), rows grouped by
    client.
    """
    import datasets
    import numpy as np

    from .images import column_values

    if not 0.0 < float(train_fraction) < 1.0:
        raise ConfigError(f"train_fraction must be in (0, 1) (LEAF: 0.9), got {train_fraction!r}")
    if client_column not in dataset.column_names:
        raise ConfigError(f"{client_column!r} is not a column of the dataset (columns: {dataset.column_names}); it "
                         "names each sample's user (the natural client).")
    ids = column_values(dataset, client_column).astype(str)
    label_ids = np.asarray(label_ids, dtype=np.int64)
    names, inverse = np.unique(ids, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(names) + 1))
    eligible = [str(name) for w, name in enumerate(names) if bounds[w + 1] - bounds[w] >= max(2, min_samples)]
    kept = set(choose_users(eligible, max_clients, seed))
    rng = np.random.default_rng(seed)
    users, train_rows, test_rows = [], [], []
    for w, name in enumerate(names):
        if str(name) not in kept:
            continue
        rows = order[bounds[w]:bounds[w + 1]]
        train_pos, test_pos = split_by_sample(len(rows), train_fraction, rng)
        users.append(str(name))
        train_rows.append(rows[train_pos])
        test_rows.append(rows[test_pos])
    if not users:
        raise ConfigError(f"no {client_column} has {max(2, min_samples)} samples or more.")
    features = datasets.Features({"client_id": datasets.Value("int32"), client_column: datasets.Value("string"),
                                 **{c: dataset.features[c] for c in keep_columns},
                                 "label": datasets.ClassLabel(names=list(class_names))})
    splits, partitions = {}, {}
    for split, parts in (("train", train_rows), ("test", test_rows)):
        sizes = [len(p) for p in parts]
        rows = np.concatenate(parts)
        client_ids = np.repeat(np.arange(len(users), dtype=np.int32), sizes)
        kept_rows = dataset.select_columns(list(keep_columns)).select(rows).flatten_indices()
        table = {"client_id": client_ids, client_column: [users[i] for i in client_ids],
                 **{c: kept_rows[c] for c in keep_columns}, "label": label_ids[rows]}
        splits[split] = datasets.Dataset.from_dict(table, features=features, split=split)
        partitions[split] = contiguous_partition(sizes, label_ids[rows], class_names, seed=seed)
    return LeafClients(dataset=datasets.DatasetDict(splits), partition=partitions["train"],
                       test_partition=partitions["test"], users=users)
