"""Check a run's labels and inputs against the model once, before any round.

Without this, bad rows surface inside the rounds: a ``-1`` "missing" label becomes one more class of the
partition and fails the clients that hold it, labels ``>= num_labels`` or NaN pixels make some clients fail every
round while the rest trains, a client whose labels are all ``-100`` (the ignore index) gives NaN losses, string
labels fail in every client, and out-of-range test labels crash the evaluation after round 1.

:func:`validate_inputs` (called by ``FederatedTrainer`` before it partitions, so the CLI, the recipes and the
Python API are all covered) reads the training and evaluation splits once and finds, per split:

* the label column's type: strings (encode them: ``dataset.class_encode_column("label")`` gives a ``ClassLabel``)
  or float labels for a classifier refuse the run whatever ``drop_invalid_rows`` says;
* per row: a missing (null) label, a negative label other than the ignore index ``-100`` (``-1`` is how
  ``datasets`` marks a missing ``ClassLabel``), a label ``>= num_labels`` (the model's ``config.num_labels``,
  or its vocabulary for token labels of a language model; a model that declares neither is checked for the
  rest), a NaN/Inf float label, a row whose every label is ``-100`` (nothing to learn; a batch of such rows
  has a NaN loss), NaN/Inf in a float input column (``pixel_values``, features);
* a dataset with an on-the-fly transform (``set_transform``: images decoded and normalised when read) has its
  stored columns checked in full, and its first :data:`TRANSFORM_SAMPLE_ROWS` transformed rows for NaN/Inf
  (a systematic fault such as a normalisation ``std`` of 0); decoding every image is not done, so a NaN the
  transform makes in a single later row is not seen here.

The problems are reported together, with their counts per split, in one :class:`InvalidInputError`; with
``drop_invalid_rows`` (``--drop_invalid_rows``) the bad rows are dropped instead, the counts logged and kept in
the :class:`InputReport` (written to ``<output_dir>/data_validation.json`` and to ``federated_config.json`` of
the final model). Datasets that are not ``datasets.Dataset`` (a torch ``Dataset``) are not read.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "IGNORE_INDEX",
    "InputReport",
    "InvalidInputError",
    "LabelSpace",
    "SplitReport",
    "TRANSFORM_SAMPLE_ROWS",
    "check_split",
    "model_label_space",
    "num_labels_from_data",
    "validate_inputs",
]

logger = logging.getLogger(__name__)

#: the label value a loss ignores (``CrossEntropyLoss(ignore_index=-100)``, transformers' collators)
IGNORE_INDEX = -100
#: rows of a transformed dataset read through its transform to look for NaN/Inf
TRANSFORM_SAMPLE_ROWS = 8
_CHUNK_ROWS = 8192
_LABEL_COLUMNS = ("labels", "label", "label_ids")
_EXAMPLES = 5

#: per-row problems (droppable), in report order: key -> description
ROW_PROBLEMS = {
    "label_missing": "a missing (null) label",
    "label_negative": f"a negative label other than the ignore index {IGNORE_INDEX} (-1 usually marks a missing label)",
    "label_too_large": "a label >= num_labels",
    "label_not_finite": "a NaN/Inf label",
    "label_all_ignored": f"no label to learn from (every label is {IGNORE_INDEX}, or none)",
    "input_not_finite": "NaN/Inf in a float input",
}


class InvalidInputError(ValueError):
    """The data does not fit the model; the message lists every problem with its counts per split."""

    def __init__(self, message: str, report: InputReport | None = None):
        super().__init__(message)
        self.report = report


@dataclass
class LabelSpace:
    """What labels the model takes.

    Attributes:
        num_labels: classes of a classifier (``config.num_labels``, or a ``num_labels``/``num_classes``
            attribute); None when the model declares none (the upper bound is then not checked).
        vocab_size: output vocabulary of a language model (token labels); None for other models.
        problem_type: ``config.problem_type`` (``"regression"``, ``"multi_label_classification"``, ...).
        source: where ``num_labels`` was read (for messages).
    """

    num_labels: int | None = None
    vocab_size: int | None = None
    problem_type: str | None = None
    source: str = "the model"

    def bound(self, token_labels: bool) -> tuple[int | None, str]:
        """The exclusive upper bound of a label and its name."""
        if token_labels and self.vocab_size is not None:
            return self.vocab_size, "the model's vocabulary size"
        return self.num_labels, "num_labels"

    @property
    def float_labels_allowed(self) -> bool:
        """Regression or multi-label targets are floats; a classifier's class ids are not."""
        if self.problem_type in ("regression", "multi_label_classification"):
            return True
        return self.num_labels is None or self.num_labels == 1


def model_label_space(model) -> LabelSpace:
    """:class:`LabelSpace` of ``model`` (a transformers model, an hf_fedflat model, a peft wrapper, a module)."""
    base = model
    get_base = getattr(model, "get_base_model", None)  # peft
    if callable(get_base):
        try:
            base = get_base()
        except Exception:  # noqa: BLE001 - not a peft model after all
            base = model
    config = getattr(base, "config", None)
    problem_type = getattr(config, "problem_type", None) if config is not None else None
    vocab_size = None
    get_output = getattr(base, "get_output_embeddings", None)
    if callable(get_output):
        try:
            head = get_output()
        except Exception:  # noqa: BLE001
            head = None
        weight = getattr(head, "weight", None)
        if weight is not None:
            vocab_size = int(weight.shape[0])
    for owner, name, source in ((config, "num_labels", "model.config.num_labels"), (base, "num_labels", "model.num_labels"),
                                (base, "num_classes", "model.num_classes")):
        value = getattr(owner, name, None) if owner is not None else None
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
            return LabelSpace(int(value), vocab_size, problem_type, source)
    return LabelSpace(None, vocab_size, problem_type, "the model")


def num_labels_from_data(dataset, label_column: str) -> int:
    """The number of classes of ``label_column``: ``ClassLabel.num_classes``, else ``1 +`` the largest valid id.

    Negative ids (``-1`` "missing", the ignore index ``-100``) are not classes: they do not make the model one
    class larger (:func:`validate_inputs` then reports or drops their rows). String labels raise: encode them.
    """
    import datasets

    feature = dataset.features[label_column]
    if isinstance(feature, datasets.ClassLabel):
        return int(feature.num_classes)
    dtype = getattr(feature, "dtype", None)
    if dtype in ("string", "large_string"):
        raise InvalidInputError(_string_label_message(label_column, "train"))
    values = np.asarray(dataset.select_columns([label_column]).with_format("numpy")[:][label_column])
    if values.dtype.kind not in "iub":
        raise InvalidInputError(f"{label_column}: class ids must be integers, got {values.dtype} values; cast the "
                                "column (dataset.cast_column(column, datasets.Value('int64'))) or use a ClassLabel.")
    valid = values[values >= 0]
    if valid.size == 0:
        raise InvalidInputError(f"{label_column}: no row has a valid (non-negative) class id.")
    return int(valid.max()) + 1


# -------------------------------------------------------------------------------------------------
@dataclass
class SplitReport:
    """What :func:`check_split` found in one split.

    Attributes:
        split: ``"train"`` or ``"eval"``.
        num_rows: rows read.
        label_column: the column checked as labels (None: the split has none).
        rows: problem key (:data:`ROW_PROBLEMS`) -> indices of the rows that have it.
        fatal: problems no row drop can fix (string labels, a transform that makes NaN).
        examples: problem key -> a short text with the first rows and values.
        notes: what was not checked, and why.
        dropped: rows dropped (with ``drop_invalid_rows``).
        bound, bound_name: the labels' upper bound (None: not checked) and what it is.
    """

    split: str
    num_rows: int
    label_column: str | None
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    fatal: list[str] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dropped: int = 0
    bound: int | None = None
    bound_name: str = "num_labels"

    def invalid_rows(self) -> np.ndarray:
        """Sorted indices of the rows with at least one problem."""
        if not self.rows:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate([np.asarray(r, dtype=np.int64) for r in self.rows.values()]))

    def counts(self) -> dict[str, int]:
        return {key: int(len(self.rows[key])) for key in ROW_PROBLEMS if key in self.rows and len(self.rows[key])}

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.num_rows, "label_column": self.label_column, "invalid_rows": int(self.invalid_rows().size),
                "dropped_rows": self.dropped, "problems": self.counts(), "fatal": list(self.fatal),
                "notes": list(self.notes)}


@dataclass
class InputReport:
    """What :func:`validate_inputs` found (and dropped) in every split."""

    label_space: LabelSpace
    drop_invalid_rows: bool
    splits: dict[str, SplitReport] = field(default_factory=dict)
    #: clients of a given partition left without any row after the drop (refused)
    empty_clients: list[int] = field(default_factory=list)

    @property
    def dropped(self) -> dict[str, dict[str, Any]]:
        """``{split: {"rows": n, "problems": {problem: count}}}`` for the splits rows were dropped from."""
        return {name: {"rows": s.dropped, "problems": s.counts()} for name, s in self.splits.items() if s.dropped}

    def to_dict(self) -> dict[str, Any]:
        space = self.label_space
        return {"num_labels": space.num_labels, "num_labels_from": space.source if space.num_labels else None,
                "vocab_size": space.vocab_size, "drop_invalid_rows": self.drop_invalid_rows,
                "splits": {name: s.to_dict() for name, s in self.splits.items()}}


# -------------------------------------------------------------------------------------------------
def _is_dataset(dataset) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover
        return False
    return isinstance(dataset, datasets.Dataset)


def _label_column(dataset, preferred: str | None) -> str | None:
    """The column the model is given as labels (transformers' collators rename ``label`` to ``labels``)."""
    names = dataset.column_names
    for name in (*_LABEL_COLUMNS, preferred):
        if name and name in names:
            return name
    return None


def _input_columns(dataset, model, label_column: str | None) -> list[str]:
    """Stored columns the model may read: the format's columns, narrowed to ``forward``'s arguments when it names them."""
    columns = dataset.format.get("columns") or dataset.column_names
    columns = [c for c in columns if c in dataset.column_names and c != label_column and c not in _LABEL_COLUMNS]
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return columns
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters):
        return columns
    names = {p.name for p in parameters}
    return [c for c in columns if c in names] or columns


def _flatten(array):
    """Leaf values of an Arrow array and, for each, its row (nested lists flattened)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = np.arange(len(array), dtype=np.int64)
    if isinstance(array, pa.ExtensionArray):  # datasets' Array2D/3D: nested lists underneath
        array = array.storage
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or pa.types.is_fixed_size_list(array.type):
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False).astype(np.int64)
        rows = rows[parents]
        array = pc.list_flatten(array)
    return array, rows


def _leaf_type(feature) -> Any:
    import pyarrow as pa

    leaf = feature.storage_type if isinstance(feature, pa.ExtensionType) else feature
    while pa.types.is_list(leaf) or pa.types.is_large_list(leaf) or pa.types.is_fixed_size_list(leaf):
        leaf = leaf.value_type
    return leaf


def _rows_with(mask: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    return np.flatnonzero(np.bincount(rows[mask], minlength=n) > 0) if mask.any() else np.zeros(0, dtype=np.int64)


def _string_label_message(column: str, split: str, examples: list | None = None) -> str:
    shown = f" ({', '.join(repr(v) for v in examples)}, ...)" if examples else ""
    return (f"{split}: label column {column!r} holds strings{shown}; the model needs integer class ids. Encode "
            f"them: dataset = dataset.class_encode_column({column!r}) (a ClassLabel, whose names become the model's "
            "id2label), or map them with a label2id dict.")


class _Accumulator:
    """Per-problem row indices gathered over the chunks of a split."""

    def __init__(self):
        self.rows: dict[str, list[np.ndarray]] = {}
        self.examples: dict[str, list[str]] = {}

    def add(self, key: str, rows: np.ndarray, offset: int, describe=None) -> None:
        if rows.size == 0:
            return
        self.rows.setdefault(key, []).append(rows + offset)
        shown = self.examples.setdefault(key, [])
        for row in rows[: max(0, _EXAMPLES - len(shown))]:
            shown.append(f"row {int(row) + offset}" + (f": {describe(int(row))}" if describe else ""))


def check_split(dataset, split: str, model, label_space: LabelSpace, label_column: str | None = None) -> SplitReport:
    """Check one split (a ``datasets.Dataset``) against ``label_space``; see the module docstring."""
    import pyarrow as pa

    column = _label_column(dataset, label_column)
    report = SplitReport(split, len(dataset), column)
    if column is None:
        report.notes.append(f"no label column ({', '.join(_LABEL_COLUMNS)}) stored: labels not checked (made by a "
                            "transform or the collator)")
    inputs = _input_columns(dataset, model, column)
    features = dataset.data.schema  # Arrow types of the stored columns
    float_inputs = [c for c in inputs if pa.types.is_floating(_leaf_type(features.field(c).type))]
    checked = ([column] if column else []) + float_inputs
    acc = _Accumulator()
    label_leaf = _leaf_type(features.field(column).type) if column else None
    if column and (pa.types.is_string(label_leaf) or pa.types.is_large_string(label_leaf)):
        first = dataset.select_columns([column]).with_format("arrow")[: 3].column(column).to_pylist()
        report.fatal.append(_string_label_message(column, split, first))
        column = None
        checked = float_inputs
    token_labels = column is not None and label_leaf is not None and features.field(column).type != label_leaf
    if column and pa.types.is_floating(label_leaf) and not token_labels and not label_space.float_labels_allowed:
        report.fatal.append(
            f"{split}: label column {column!r} holds floats, but the model is a classifier with {label_space.num_labels} "
            f"classes ({label_space.source}); class ids must be integers: dataset = dataset.cast_column({column!r}, "
            "datasets.Value('int64')), or a ClassLabel. (For regression set config.problem_type='regression'.)")
        column = None
        checked = float_inputs
    bound, bound_name = label_space.bound(token_labels)
    if column and bound is None and not pa.types.is_floating(label_leaf):
        report.notes.append("the model declares no num_labels (config.num_labels, model.num_labels): labels are not "
                            "checked against an upper bound")
    if checked and len(dataset):
        view = dataset.select_columns(checked).with_format("arrow")
        for start in range(0, len(dataset), _CHUNK_ROWS):
            table = view[start: start + _CHUNK_ROWS]
            n = table.num_rows
            if column:
                _check_labels(acc, table.column(column).combine_chunks(), n, start, bound, bound_name)
            for name in float_inputs:
                values, rows = _flatten(table.column(name).combine_chunks())
                finite = np.isfinite(values.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64, copy=False))
                acc.add("input_not_finite", _rows_with(~finite, rows, n), start, lambda r, name=name: f"column {name!r}")
    for key in ROW_PROBLEMS:
        if key in acc.rows:
            report.rows[key] = np.unique(np.concatenate(acc.rows[key]))
            report.examples[key] = ", ".join(acc.examples[key])
    if dataset.format.get("type") == "custom" and len(dataset):  # set_transform / with_transform
        _check_transformed(dataset, split, report)
    report.bound, report.bound_name = bound, bound_name
    return report


def _check_labels(acc: _Accumulator, array, n: int, offset: int, bound: int | None, bound_name: str) -> None:
    import pyarrow as pa

    values, rows = _flatten(array)
    # a null row (a missing label, or a missing list of token labels)
    row_null = array.is_null().to_numpy(zero_copy_only=False)
    value_null = values.is_null().to_numpy(zero_copy_only=False)
    acc.add("label_missing", np.flatnonzero(row_null) if not value_null.any()
            else np.union1d(np.flatnonzero(row_null), rows[value_null]), offset)
    data = values.fill_null(0).to_numpy(zero_copy_only=False)
    present = ~value_null
    if pa.types.is_floating(values.type):
        bad = present & ~np.isfinite(data)
        acc.add("label_not_finite", _rows_with(bad, rows, n), offset)
        return
    data = data.astype(np.int64, copy=False)
    ignored = data == IGNORE_INDEX
    negative = present & (data < 0) & ~ignored
    acc.add("label_negative", _rows_with(negative, rows, n), offset,
            lambda r: f"label {int(data[(rows == r) & negative][0])}")
    if bound is not None:
        large = present & (data >= bound)
        acc.add("label_too_large", _rows_with(large, rows, n), offset,
                lambda r: f"label {int(data[(rows == r) & large][0])} >= {bound_name} {bound}")
    learnable = np.bincount(rows[present & ~ignored], minlength=n)
    acc.add("label_all_ignored", np.flatnonzero((learnable == 0) & ~row_null), offset)


def _check_transformed(dataset, split: str, report: SplitReport) -> None:
    import torch

    # the first rows not already found bad in the stored columns (their NaN is counted there, and droppable)
    flagged = set(report.invalid_rows().tolist())
    sample = [i for i in range(min(len(dataset), TRANSFORM_SAMPLE_ROWS + len(flagged))) if i not in flagged]
    sample = sample[:TRANSFORM_SAMPLE_ROWS]
    rows = len(sample)
    if not rows:
        return
    try:
        batch = dataset[sample]
    except Exception as error:  # noqa: BLE001 - it would fail in every client
        report.fatal.append(f"{split}: the dataset's transform fails on its first {rows} rows "
                            f"({type(error).__name__}: {error}).")
        return
    for name, value in batch.items():
        if isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value):
            try:
                value = torch.stack(value)
            except RuntimeError:
                continue
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value) if value.dtype.kind == "f" else None
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            bad = int((~torch.isfinite(value.reshape(value.shape[0], -1))).any(dim=1).sum()) if value.ndim else 0
            if bad:
                report.fatal.append(
                    f"{split}: the dataset's transform makes NaN/Inf in {name!r} ({bad} of the first {rows} valid "
                    "rows read through it), e.g. a normalisation std of 0 or a NaN mean: fix the transform.")
    report.notes.append(f"transformed dataset: stored columns checked in full, the first {rows} rows through the "
                        "transform")


# -------------------------------------------------------------------------------------------------
def validate_inputs(
    model,
    train_dataset,
    eval_dataset=None,
    *,
    label_column: str | None = None,
    partition=None,
    drop_invalid_rows: bool = False,
):
    """Check the splits against ``model`` before any round; drop the bad rows or refuse.

    Args:
        model: the model to federate (its label space: :func:`model_label_space`).
        train_dataset, eval_dataset: the splits (``datasets.Dataset``; others are not read).
        label_column: the partitioner's label column (used when the split has no ``labels``/``label`` column).
        partition: a partition that comes with the data (its row indices are remapped after a drop).
        drop_invalid_rows: drop the rows with a problem (logged, counted in the report) instead of refusing.

    Returns:
        ``(train_dataset, eval_dataset, partition, report)``: the splits without the dropped rows (the same
        objects when nothing was dropped) and the :class:`InputReport`.

    Raises:
        InvalidInputError: listing every problem, with its counts per split, when there are bad rows and
            ``drop_invalid_rows`` is off, for problems no drop can fix, or when a drop would empty a split
            or a client of ``partition``.
    """
    space = model_label_space(model)
    report = InputReport(space, bool(drop_invalid_rows))
    splits = {"train": train_dataset, "eval": eval_dataset}
    for name, dataset in splits.items():
        if dataset is None:
            continue
        if not _is_dataset(dataset):
            logger.info("%s split: a %s, not a datasets.Dataset: its rows are not checked before training.", name,
                        type(dataset).__name__)
            continue
        report.splits[name] = check_split(dataset, name, model, space, label_column)
    fatal = [line for s in report.splits.values() for line in s.fatal]
    invalid = {name: s.invalid_rows() for name, s in report.splits.items()}
    if fatal or (any(rows.size for rows in invalid.values()) and not drop_invalid_rows):
        raise InvalidInputError(_message(report, fatal), report)
    for name, rows in invalid.items():
        if not rows.size:
            continue
        dataset = splits[name]
        if rows.size == len(dataset):
            raise InvalidInputError(f"{name}: every one of its {len(dataset)} rows is invalid "
                                    f"({_counts_text(report.splits[name])}); nothing would be left to "
                                    f"{'train on' if name == 'train' else 'evaluate'}.", report)
        keep = np.setdiff1d(np.arange(len(dataset)), rows)
        if name == "train" and partition is not None:
            partition = _drop_from_partition(partition, rows, _row_labels(dataset, report.splits[name].label_column,
                                                                          rows), len(dataset), report)
        splits[name] = dataset.select(keep)
        report.splits[name].dropped = int(rows.size)
        logger.warning("drop_invalid_rows: dropped %d of the %d %s rows (%s).", rows.size, len(dataset), name,
                       _counts_text(report.splits[name]))
    for split in report.splits.values():
        for note in split.notes:
            logger.info("%s split: %s.", split.split, note)
    return splits["train"], splits["eval"], partition, report


def _counts_text(split: SplitReport) -> str:
    return "; ".join(f"{count} with {ROW_PROBLEMS[key]}" for key, count in split.counts().items())


def _message(report: InputReport, fatal: list[str]) -> str:
    space = report.label_space
    lines = ["The data does not fit the model (checked before any round"
             + (f"; num_labels = {space.num_labels} from {space.source}" if space.num_labels else "")
             + (f"; vocabulary {space.vocab_size}" if space.vocab_size else "") + "):"]
    lines += [f"  {line}" for line in fatal]
    droppable = False
    for split in report.splits.values():
        for key, count in split.counts().items():
            droppable = True
            text = ROW_PROBLEMS[key]
            if key == "label_too_large":
                text = f"a label >= {split.bound_name} ({split.bound})"
            where = f"column {split.label_column!r}" if key.startswith("label") else "inputs"
            lines.append(f"  {split.split}: {count} of {split.num_rows} rows have {text} [{where}] "
                         f"(e.g. {split.examples.get(key, '')})")
    if droppable:
        lines.append("Fix the data, or drop these rows with --drop_invalid_rows (DataArguments.drop_invalid_rows; "
                     "FederatedTrainer(..., drop_invalid_rows=True)): the counts dropped are logged and recorded in "
                     "data_validation.json.")
    return "\n".join(lines)


def _row_labels(dataset, column: str | None, rows: np.ndarray) -> dict[int, int]:
    """Scalar integer labels of ``rows`` (to take them off a partition's label counts); {} when not scalar ints."""
    if column is None:
        return {}
    values = dataset.select(rows.tolist()).select_columns([column]).with_format("arrow")[:].column(column)
    out = {}
    for row, value in zip(rows.tolist(), values.to_pylist()):
        if isinstance(value, int) and not isinstance(value, bool):
            out[row] = value
    return out


def _drop_from_partition(partition, rows: np.ndarray, labels: dict[int, int], num_rows: int, report: InputReport):
    """``partition`` on the dataset without ``rows``: indices remapped, label counts taken off per client."""
    keep = np.ones(num_rows, dtype=bool)
    keep[rows] = False
    new_index = np.cumsum(keep) - 1
    dropped_per_client = []
    indices = []
    for idx in partition.client_indices:
        kept = idx[keep[idx]]
        dropped_per_client.append(idx[~keep[idx]])
        indices.append(new_index[kept].astype(np.int64))
    empty = [c for c, idx in enumerate(indices) if idx.size == 0 and partition.client_indices[c].size]
    if empty:
        report.empty_clients = empty
        raise InvalidInputError(
            f"drop_invalid_rows: client(s) {', '.join(map(str, empty[:10]))}{' ...' if len(empty) > 10 else ''} of the "
            "partition that comes with the data would have no row left (every row of theirs is invalid: "
            f"{_counts_text(report.splits['train'])}). Fix the data, or drop those clients before training.", report)
    counts = partition.label_counts.copy()
    for client, gone in enumerate(dropped_per_client):
        for row in gone.tolist():
            counts[client] = _take_off(counts[client], labels.get(row))
    return dataclasses.replace(partition, client_indices=indices, label_counts=counts,
                               num_rows=int(keep.sum()) if partition.num_rows is not None else None)


def _take_off(row: np.ndarray, label: int | None) -> np.ndarray:
    """One row off a client's label counts: from the column of its label when the partition's classes are the
    label ids and that column counts it, else from the client's largest class (an invalid label is no class of
    the partition; the client's size stays right either way)."""
    row = row.copy()
    column = label if label is not None and 0 <= label < row.size and row[label] > 0 else int(np.argmax(row))
    row[column] -= 1
    return row
