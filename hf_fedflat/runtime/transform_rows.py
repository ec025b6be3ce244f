"""Client rows of a dataset with an on-the-fly transform, each batch read by one ``dataset[rows]`` call (mechanism
``transform_batches`` of :mod:`.switch`).

For a ``datasets.Dataset`` with a ``with_transform`` / ``set_transform`` function, the Trainer's path selects each
client's rows (``Dataset.select``: ~1.6 ms a client on workload 6's digits, more than its local training), and its
``DataLoader`` reads a batch through ``Dataset.__getitems__``: the transform once on the batch's rows, its output then
split into one dict per row (a Python loop over the rows) and stacked back by the collator. :class:`TransformedRows`
is a client's rows without a select: its ``__getitems__`` makes the same single ``parent[rows]`` call on the same rows
in the same order (so the transform sees the same batch and draws its random numbers, if any, at the same point of
the run) and collates it as the collator would collate the rows: where every value is a tensor with one entry per
row and the collator is the default one, the rows' stack is the value itself (copied to the standard layout), so no
split is made; otherwise the rows are split and the collator runs on them, as in the Trainer's path. The batch goes
through :class:`~.materialize.PreCollated` (the Trainer's ``DataLoader``) or the lean client loop's batch reader
(:class:`~.client_loop.TensorRowsLoader`, which reads one batch ahead as accelerate's ``DataLoaderShard`` does, so a
random transform draws in the same order): bit-identical weights either way (``tests/runtime/test_transform_rows.py``).

Evaluation: a transform not declared deterministic runs on every batch of every evaluation (:mod:`.eval_data` keeps
the batches of a deterministic one); its evaluation dataloader (:class:`TransformedEvalLoaders`, one prepared per
dataset) reads the same batches through :class:`TransformedRows` in the Trainer's order, so the transform runs once
per batch, on the same rows, at the same point of the evaluation, without the split into rows.

Applies to a ``datasets.Dataset`` whose format is a transform, with ``remove_unused_columns=False`` (the run's
default: the Trainer would otherwise drop the transform's input columns), random sampling and no dataloader
workers, one process; anything else keeps the Trainer's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .materialize import CollatedBatch, is_default_collator

__all__ = ["TransformedEvalLoaders", "TransformedRows", "TransformedSource", "transformed_source"]


class TransformedRows(torch.utils.data.Dataset):
    """Rows ``indices`` of ``source.dataset`` (a dataset with a transform), a batch read by one ``dataset[rows]``."""

    def __init__(self, source: "TransformedSource", indices):
        self.source = source
        self.indices = np.asarray(indices, dtype=np.int64)
        self._len = int(self.indices.shape[0])

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.source.dataset[int(self.indices[index])]

    def batch(self, positions) -> dict[str, Any]:
        """The collated batch of the rows at ``positions`` (a sequence or a tensor of positions in this client)."""
        positions = positions.numpy() if isinstance(positions, torch.Tensor) else np.asarray(positions, dtype=np.int64)
        rows = self.indices[positions]
        if len(rows) > 1 and rows[-1] - rows[0] == len(rows) - 1 and (np.diff(rows) == 1).all():
            # consecutive rows (an evaluation's batches): the same rows, in one batch for the transform, through a
            # slice, which ``datasets`` reads without a gather (0.49 vs 0.76 ms for 128 rows of workload 6's digits)
            return self.source.collate(self.source.dataset[int(rows[0]):int(rows[-1]) + 1])
        return self.source.collate(self.source.dataset[rows.tolist()])

    def __getitems__(self, positions: Sequence[int]) -> list[CollatedBatch]:
        return [CollatedBatch(self.batch(positions))] * len(positions)


class TransformedSource:
    """A training dataset with a transform and the run's collator: makes each client's :class:`TransformedRows`."""

    def __init__(self, dataset, collator):
        self.dataset, self.collator = dataset, collator
        self.default_collator = is_default_collator(collator)

    def rows(self, indices) -> TransformedRows:
        return TransformedRows(self, indices)

    def collate(self, batch: dict) -> dict:
        """What the collator makes of ``batch``'s rows (``Dataset.__getitems__``'s split, then the collator)."""
        n = len(batch[next(iter(batch))])
        if self.default_collator and all(
            type(value) is torch.Tensor and value.dim() > 0 and value.shape[0] == n for value in batch.values()
        ) and not {"label", "label_ids"} & batch.keys():
            # the default collator stacks tensor rows: the same values, dtype and shape as the batch's own
            return {key: value.contiguous() for key, value in batch.items()}
        return self.collator([{key: value[i] for key, value in batch.items()} for i in range(n)])


def transformed_source(trainer, dataset) -> TransformedSource | None:
    """A :class:`TransformedSource` for ``trainer``'s clients of ``dataset``, or None where the Trainer's path is kept
    (see the module docstring)."""
    import datasets

    args = trainer.args
    if not (
        isinstance(dataset, datasets.Dataset) and len(dataset) > 0
        and trainer.accelerator.num_processes == 1 and args.world_size <= 1
        and dataset.format.get("type") == "custom"  # a with_transform / set_transform function
        and not args.remove_unused_columns
        and args.train_sampling_strategy == "random" and args.dataloader_num_workers == 0
    ):
        return None
    return TransformedSource(dataset, trainer.data_collator)


class TransformedEvalLoaders:
    """A local Trainer's evaluation dataloaders over datasets with a transform not declared deterministic: the
    Trainer's own (a sequential sampler in batches of ``per_device_eval_batch_size``, prepared by the accelerator)
    over :class:`TransformedRows`, one per dataset object and state (its fingerprint, the transform, the batch size,
    ``dataloader_drop_last``, the collator)."""

    def __init__(self):
        import weakref

        self._loaders: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()

    def loader(self, trainer, dataset):
        """The evaluation dataloader for ``dataset``, or None where the Trainer's own applies instead (see
        :func:`transformed_source`; also an overridden data method of the Trainer)."""
        from torch.utils.data import DataLoader, SequentialSampler
        from transformers import Trainer

        from .materialize import PreCollated

        args = trainer.args
        if any(getattr(type(trainer), name) is not getattr(Trainer, name) for name in ("_get_dataloader",
                                                                                     "_get_eval_sampler")):
            return None
        source = transformed_source(trainer, dataset)
        if source is None:
            return None
        transform = (dataset.format.get("format_kwargs") or {}).get("transform")
        key = (dataset._fingerprint, id(transform), args.eval_batch_size, args.dataloader_drop_last,
               id(trainer.data_collator))
        cached = self._loaders.get(dataset)
        if cached is not None and cached[0] == key:
            return cached[1]
        rows = source.rows(range(len(dataset)))
        loader = DataLoader(rows, batch_size=args.eval_batch_size, sampler=SequentialSampler(rows),
                            collate_fn=PreCollated(trainer.data_collator), drop_last=args.dataloader_drop_last,
                            num_workers=0, pin_memory=args.dataloader_pin_memory)
        loader = trainer.accelerator.prepare(loader)
        self._loaders[dataset] = (key, loader)
        return loader
