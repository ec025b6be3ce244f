"""Client datasets selected from a partitioned dataset without hashing its transform."""

from __future__ import annotations

import hashlib
import weakref

import datasets
import numpy as np

from .switch import enabled

#: dataset -> (its fingerprint, an unformatted twin over the same table); see :func:`select_rows`
_UNFORMATTED_TWINS: "weakref.WeakKeyDictionary[datasets.Dataset, tuple[str, datasets.Dataset]]" = (
    weakref.WeakKeyDictionary()
)


def select_rows(dataset: datasets.Dataset, indices) -> datasets.Dataset:
    """``dataset.select(indices)``: the same rows, format and transform, without hashing the transform.

    ``Dataset.select`` builds the subset unformatted and re-applies the parent's format with
    ``set_format``, which dill-pickles the format (a ``set_transform`` function, its code and globals)
    for a fingerprint that datasets' ``transmit_format`` then throws away: 6-20 ms per call on this
    machine, more than the local training of a small client. Here the rows are selected from an
    unformatted twin of the dataset (made once per dataset and fingerprint, no data copied) and the
    format attributes are set as ``transmit_format`` sets them; the subset's fingerprint hashes the
    parent's fingerprint and the indices.
    """
    indices = np.asarray(indices, dtype=np.int64)
    if len(dataset) == 0 or not enabled("select_rows"):  # (an empty dataset: select returns it itself)
        return dataset.select(indices)
    cached = _UNFORMATTED_TWINS.get(dataset)
    if cached is None or cached[0] != dataset._fingerprint:  # in-place changes move the fingerprint
        cached = (dataset._fingerprint, dataset.with_format(None))
        _UNFORMATTED_TWINS[dataset] = cached
    fingerprint = hashlib.blake2b(dataset._fingerprint.encode() + indices.tobytes(), digest_size=8).hexdigest()
    subset = cached[1].select(indices, new_fingerprint=fingerprint)
    columns = dataset._format_columns
    subset._format_type = dataset._format_type
    subset._format_kwargs = dict(dataset._format_kwargs)
    subset._format_columns = None if columns is None else sorted(set(columns))
    subset._output_all_columns = dataset._output_all_columns
    return subset
