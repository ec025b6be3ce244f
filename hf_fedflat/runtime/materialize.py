"""Client data read once into tensors, each batch collated by one index operation.

A ``datasets.Dataset`` in ``torch`` or ``numpy`` format formats every row it serves: for nested numeric
lists (images stored with ``Dataset.from_dict``) that per-row work was most of a round of a small model
(workload 6, ``benchmarks/user_data.py``: 3.3x a plain loop indexing tensors). When the columns the local ``Trainer`` feeds
the model are fixed-shape numbers, :func:`materialize` reads them once, whole: straight from the Arrow table where the
columns are numbers or fixed-length nested lists of numbers (cast as the formatter casts a row), else one
formatted batch (``dataset[:]``; a ``format_kwargs`` dtype, decoded images), and each client gets :class:`TensorRows`, a light torch ``Dataset`` over its row
indices whose ``__getitems__`` (which torch's ``DataLoader`` calls with a batch's indices) returns the
batch already collated. :class:`PreCollated` wraps the Trainer's collator and passes such a batch
through; everything else goes to the wrapped collator unchanged.

The batches are the ones the Trainer's own path builds: the same rows in the same order (the sampler
only sees the length), the same columns (the Trainer's ``_remove_unused_columns``), and the collator's
keys, dtypes and values (only the default collator, ``default_data_collator`` / ``DefaultDataCollator``,
is reproduced, and the result is checked against the real collator on a sample of rows before use), so
the final weights are identical (``tests/runtime/test_materialize.py``). Anything else (a transform, a custom
format, strings, ragged lists, another collator, a dataset over the memory budget) keeps the
``datasets`` path.

The budget: ``HF_FEDFLAT_MATERIALIZE_MAX_BYTES`` (bytes of the materialised columns; default 1 GiB;
``0`` materialises nothing). The mechanism is ``materialize`` of :mod:`.switch`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

#: environment variable of the memory budget (bytes)
BUDGET_ENV = "HF_FEDFLAT_MATERIALIZE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30
#: rows of the check against the real collator
_CHECK_ROWS = 8


def max_bytes() -> int:
    """The memory budget of materialised columns (``HF_FEDFLAT_MATERIALIZE_MAX_BYTES``, default 1 GiB)."""
    value = os.environ.get(BUDGET_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_BYTES
    try:
        budget = int(float(value))
    except ValueError:
        raise ValueError(f"{BUDGET_ENV}={value!r}: give a number of bytes (e.g. 1073741824; 0 turns it off)") from None
    if budget < 0:
        raise ValueError(f"{BUDGET_ENV}={value!r} is negative; give a number of bytes (0 turns it off)")
    return budget


class CollatedBatch:
    """A batch already collated by :class:`TensorRows` (``__getitems__`` returns it once per row)."""

    __slots__ = ("batch",)

    def __init__(self, batch: dict[str, torch.Tensor]):
        self.batch = batch


class PreCollated:
    """A collator that passes :class:`CollatedBatch` through and hands every other batch to ``collator``."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        if features and type(features[0]) is CollatedBatch:
            return features[0].batch
        return self.collator(features)

    def __getattr__(self, name):  # the wrapped collator's attributes (e.g. tokenizer, return_tensors)
        if name == "collator":
            raise AttributeError(name)
        return getattr(self.collator, name)


def wrap_collator(collator):
    """``collator`` wrapped in :class:`PreCollated` (once)."""
    return collator if isinstance(collator, PreCollated) else PreCollated(collator)


class TensorRows(torch.utils.data.Dataset):
    """Rows ``indices`` of materialised columns.

    ``ds[i]`` is the row as the source dataset's format gives it (the kept columns); ``ds.__getitems__``
    (a batch's indices) the batch as the default collator gives it, in a :class:`CollatedBatch` repeated
    once per row (so the ``DataLoader``'s ``RemoveColumnsCollator`` passes it through unchanged).
    """

    def __init__(self, materialized: "Materialized", indices):
        self.materialized = materialized
        self.indices = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        self._len = int(self.indices.shape[0])  # (Tensor.__len__ is Python; a client's loop asks ~10 times)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = int(self.indices[index])
        m = self.materialized
        values = {k: m.row(k, row) for k in m.columns}
        if m.numpy_format:
            return {k: (v.numpy() if v.dim() > 0 else v.numpy()[()]) for k, v in values.items()}
        return values

    def __getitems__(self, indices: Sequence[int]) -> list[CollatedBatch]:
        rows = self.indices[torch.as_tensor(indices, dtype=torch.int64)]
        return [CollatedBatch(self.materialized.collate(rows))] * len(indices)

    @property
    def column_names(self) -> list[str]:
        return list(self.materialized.columns)


class Materialized:
    """The kept columns of a dataset as tensors and how the default collator turns rows into a batch."""

    def __init__(self, columns: dict[str, torch.Tensor], plan: list[tuple[str, str, torch.dtype]], numpy_format: bool,
                 row_dtypes: dict[str, torch.dtype] | None = None):
        self.columns = columns  # as stored where narrower (int8 ids), cast per batch: the same values as a whole cast
        self.plan = plan  # (batch key, source column, dtype) in the collator's key order
        self.numpy_format = numpy_format
        self.row_dtypes = {k: c.dtype for k, c in columns.items()} | (row_dtypes or {})  # the format's dtype of a row
        self.nbytes = sum(c.element_size() * c.numel() for c in columns.values())

    def row(self, column: str, rows) -> torch.Tensor:
        """``rows`` of ``column`` in the dtype the dataset's format gives them."""
        values = self.columns[column][rows]
        dtype = self.row_dtypes[column]
        return values if values.dtype == dtype else values.to(dtype)

    def collate(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = {}
        for key, column, dtype in self.plan:
            values = self.row(column, rows)
            batch[key] = values if values.dtype == dtype else values.to(dtype)
        return batch

    def rows(self, indices) -> TensorRows:
        return TensorRows(self, indices)


def is_default_collator(collator) -> bool:
    """Whether ``collator`` (unwrapped from :class:`PreCollated`) is transformers' default collator, the one
    :meth:`Materialized.collate` reproduces."""
    from transformers.data.data_collator import DefaultDataCollator, default_data_collator

    if isinstance(collator, PreCollated):
        collator = collator.collator
    if collator is default_data_collator:
        return True
    return type(collator) is DefaultDataCollator and getattr(collator, "return_tensors", "pt") == "pt"


def _format_type(dataset) -> str | None:
    from datasets.formatting import get_format_type_from_alias

    return get_format_type_from_alias(dataset.format["type"])


def materialize(trainer, dataset, budget: int | None = None) -> Materialized | None:
    """The columns ``trainer`` feeds its model from ``dataset`` as tensors, or None where that does not apply.

    Applies to a ``datasets.Dataset`` in ``torch`` or ``numpy`` format (no transform) whose kept columns are
    fixed-shape numbers, with the default collator, within ``budget`` bytes (default :func:`max_bytes`).
    """
    import datasets

    budget = max_bytes() if budget is None else budget
    skip_missing_video_reader()  # every row this reads is formatted by datasets
    if budget <= 0 or not isinstance(dataset, datasets.Dataset) or len(dataset) == 0:
        return None
    fmt = _format_type(dataset)
    if fmt not in ("torch", "numpy") or not is_default_collator(trainer.data_collator):
        return None
    try:
        pruned = trainer._remove_unused_columns(dataset, description="training")
    except ValueError:  # no column the model takes: the Trainer's own path raises its message
        return None
    first = pruned[0]
    if not first or "label_ids" in first:
        return None
    for value in first.values():
        if fmt == "torch" and not isinstance(value, torch.Tensor):
            return None
        if fmt == "numpy" and not (isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biuf"):
            return None
    stored = _arrow_item_sizes(pruned, first)  # bytes of one value as Arrow stores it, or None
    row_bytes = sum((stored[name] if stored else _row_tensor(v).element_size()) * _row_tensor(v).numel()
                    for name, v in first.items())
    if row_bytes * len(pruned) > budget:
        logger.info("Client data not materialised: %.1f MB > the budget of %.1f MB (%s)",
                    row_bytes * len(pruned) / 1e6, budget / 1e6, BUDGET_ENV)
        return None
    columns = _arrow_columns(pruned, first, fmt) if stored else None  # nested numeric lists straight from Arrow
    if columns is None:
        columns = _formatted_columns(pruned, first, fmt)  # one formatted batch of the whole dataset
        if columns is None:
            return None
    row_dtypes = {name: _row_tensor(value).dtype for name, value in first.items()}
    # A column stored wider than the format gives its rows (float64 read as float32) is cast once, as the format
    # casts each row: less memory, and no cast per batch. Narrower ones (int8 ids read as int64) stay narrow.
    columns = {name: column.to(row_dtypes[name]) if column.dtype != row_dtypes[name]
               and row_dtypes[name].itemsize <= column.dtype.itemsize else column for name, column in columns.items()}
    # The collator's output on a sample of rows: its keys and dtypes, and the check of the plan against it.
    sample = list(range(min(_CHECK_ROWS, len(pruned))))
    rows = [pruned[i] for i in sample]
    probe = Materialized(columns, [], numpy_format=fmt == "numpy", row_dtypes=row_dtypes)
    if not all(torch.equal(probe.row(name, i), _row_tensor(row[name])) for i, row in zip(sample, rows) for name in columns):
        return None
    try:
        expected = trainer.data_collator(rows)
    except Exception:  # the Trainer's own path will say what is wrong
        return None
    plan = []
    for key, value in expected.items():
        column = "label" if key == "labels" and "label" in columns and "labels" not in columns else key
        if column not in columns or not isinstance(value, torch.Tensor):
            return None
        plan.append((key, column, value.dtype))
    materialized = Materialized(columns, plan, numpy_format=fmt == "numpy", row_dtypes=row_dtypes)
    got = materialized.collate(torch.tensor(sample, dtype=torch.int64))
    if list(got) != list(expected) or not all(
        got[k].dtype == expected[k].dtype and got[k].shape == expected[k].shape and torch.equal(got[k], expected[k])
        for k in got
    ):
        return None
    logger.info("Client data materialised: %d rows, columns %s, %.1f MB", len(pruned), list(columns),
                materialized.nbytes / 1e6)
    return materialized


def _row_tensor(value) -> torch.Tensor:
    """A formatted value as a tensor (numpy values shared, not copied)."""
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))


def _fits(column: torch.Tensor, value, num_rows: int) -> bool:
    expected = _row_tensor(value)
    return column.dtype == expected.dtype and tuple(column.shape) == (num_rows, *expected.shape)


def _formatted_columns(pruned, first: dict, fmt: str) -> dict[str, torch.Tensor] | None:
    """The kept columns from one formatted batch of every row (``dataset[:]``), or None (ragged, objects)."""
    whole = pruned[:]
    columns = {}
    for name, value in first.items():
        column = whole[name]
        if fmt == "numpy":
            if not isinstance(column, np.ndarray) or column.dtype == object:
                return None
            column = torch.from_numpy(np.ascontiguousarray(column))
        elif not isinstance(column, torch.Tensor):
            return None  # ragged: a list of tensors
        if not _fits(column, value, len(pruned)):
            return None
        columns[name] = column
    return columns


def _arrow_columns(pruned, first: dict, fmt: str) -> dict[str, torch.Tensor] | None:
    """The kept columns read from the Arrow table: numbers or fixed-length nested lists of numbers without
    nulls and without a feature that decodes (images, audio), in the dtype Arrow stores (int8 character ids stay
    int8: :meth:`Materialized.row` casts each batch as the formatter casts a row); None where a column is not such."""
    import pyarrow as pa
    from datasets.features.features import require_decoding

    if pruned.format.get("format_kwargs"):  # e.g. a torch dtype: the formatter's cast, not reproduced here
        return None
    features = pruned.features
    if any(require_decoding(features[name]) for name in first if name in features):
        return None
    table = pruned.with_format("arrow")[:]  # the rows in the dataset's order (its indices mapping applied)
    columns = {}
    for name, value in first.items():
        array = table.column(name).combine_chunks()
        dims = []
        while pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or pa.types.is_fixed_size_list(array.type):
            if array.null_count:
                return None
            lengths = array.value_lengths().to_numpy(zero_copy_only=False)
            if len(lengths) == 0 or lengths.min() != lengths.max():
                return None
            dims.append(int(lengths[0]))
            array = array.flatten()
        if array.null_count or not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)
                                    or pa.types.is_boolean(array.type)):
            return None
        leaf = array.to_numpy(zero_copy_only=False).reshape(len(table), *dims)
        column = torch.from_numpy(np.require(leaf, requirements=["C", "W"]))  # Arrow's buffers are read-only
        if tuple(column.shape) != (len(pruned), *_row_tensor(value).shape):
            return None
        columns[name] = column  # the stored dtype; Materialized.row casts as the formatter casts
    return columns


def _arrow_item_sizes(pruned, first: dict) -> dict[str, int] | None:
    """Bytes per number of each kept column as Arrow stores it (nested lists of integers, floats or booleans),
    or None where a column is not such, has a decoding feature, or the format casts with its own kwargs."""
    import pyarrow as pa
    from datasets.features.features import require_decoding

    if pruned.format.get("format_kwargs"):  # e.g. a torch dtype: the formatter's cast, read formatted
        return None
    features, schema = pruned.features, pruned.data.schema
    sizes = {}
    for name in first:
        if name not in features or require_decoding(features[name]) or name not in schema.names:
            return None
        kind = schema.field(name).type
        while pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            kind = kind.value_type
        if pa.types.is_boolean(kind) or kind in (pa.int8(), pa.uint8()):
            sizes[name] = 1
        elif kind in (pa.int16(), pa.int32(), pa.int64()) or pa.types.is_floating(kind):  # no uint16+ in torch
            sizes[name] = kind.bit_width // 8
        else:
            return None
    return sizes
    return columns


# -- datasets' torch formatter: one probe of torchvision.io.VideoReader instead of one per value ---------
def skip_missing_video_reader() -> bool:
    """Make datasets' per-value ``from torchvision.io import VideoReader`` fail at once where torchvision has none.

    ``datasets``' torch formatter tries that import for every value it formats once torchvision is imported;
    torchvision 0.29 has no ``VideoReader``, and each failed ``from ... import`` searches the file system for
    a ``torchvision.io.VideoReader`` submodule. A ``None`` entry for that submodule name in ``sys.modules``
    makes the same import raise ``ImportError`` without the search (the formatter catches it as before).
    Only done when ``torchvision.io`` is imported and has no ``VideoReader``; returns whether it was done.
    """
    io = sys.modules.get("torchvision.io")
    if io is None or "torchvision.io.VideoReader" in sys.modules:
        return False
    try:
        getattr(io, "VideoReader")
        return False  # torchvision has it: nothing to skip
    except AttributeError:
        pass
    except Exception:  # a lazy attribute that fails another way: leave it alone
        return False
    sys.modules["torchvision.io.VideoReader"] = None
    return True

