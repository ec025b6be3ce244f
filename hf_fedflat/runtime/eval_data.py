"""Evaluation sets read once: the batches of the local Trainer's evaluation dataloader without ``datasets``'
per-value formatting on every evaluation (mechanism ``eval_rows`` of :mod:`.switch`).

Every evaluation of a run reads the same rows in the same order: ``Trainer.evaluate``, ``predict``, the
decentralized local models' evaluations, the diagnostics and MimeLite's full gradient all go through the Trainer's
``get_eval_dataloader`` / ``get_test_dataloader`` (a ``SequentialSampler`` in batches of
``per_device_eval_batch_size``). A ``datasets.Dataset`` in ``torch`` format formats every value of every row it
serves, each time (one ``torch.tensor`` call per value): on workload 6's evaluation set that was most of the round.
:func:`eval_dataloader` gives the Trainer a dataloader over the rows read once instead; the Trainer's own
``evaluation_loop`` (or its lean form on one process, :mod:`.eval_loop`) runs on it (``prediction_step``,
``compute_loss`` with label smoothing or ``compute_loss_func``, ``preprocess_logits_for_metrics``,
``compute_metrics``, the ``eval_*`` keys, ``no_grad``, the model in eval mode), so evaluation gives the same numbers
as the Trainer's path (``tests/runtime/test_eval_data.py``). Two forms, chosen per dataset:

* **columns** (:func:`~.materialize.materialize`): fixed-shape numeric columns with the default collator are read
  once from the Arrow table into tensors; each batch is one index operation over them;
* **batches**: otherwise, with a collator known to be deterministic (the default one, ``DataCollatorWithPadding``,
  ``DataCollatorForTokenClassification``, ``DataCollatorForSeq2Seq``, ``DataCollatorForLanguageModeling`` with
  ``mlm=False``), the collated batches of the first read are kept (a batch of a padding collator is padded to its
  own longest row, as in the Trainer's path) and replayed, a copy each time.

What is cached and what is not. A dataset with an on-the-fly transform (``with_transform`` / ``set_transform``) is
cached only when its transform declares that it is deterministic: ``transform.deterministic = True`` (see
:func:`mark_deterministic`; the evaluation transforms of :mod:`hf_fedflat.data` do). Its output for a batch is then
kept, batch by batch, as the Trainer's path would compute it. A transform that does not declare it (a random
augmentation, or one the toolkit cannot tell) is never cached: it runs on every batch of every evaluation, through
the Trainer's own path. An unknown collator (it may draw random numbers, as the masked-LM collator does), an
``IterableDataset`` or any dataset that is not a ``datasets.Dataset``, a Trainer whose data methods are overridden
(``_get_dataloader``, ``_remove_unused_columns``, ``_get_eval_sampler``), a sampler other than the sequential one,
or several processes: the Trainer's own path.

The cache is per local Trainer, keyed by the dataset object (a weak reference: a dataset no longer used is dropped)
and its fingerprint (``datasets`` moves it on every in-place change: ``set_format``, ``set_transform``, ...), its
format, the batch size, ``dataloader_drop_last`` and the collator; a new dataset object or a changed one is read
again. All kept data together stay within ``HF_FEDFLAT_MATERIALIZE_MAX_BYTES`` (default 1 GiB); a dataset that
does not fit takes the Trainer's path.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, SequentialSampler

from .materialize import CollatedBatch, PreCollated, is_default_collator, materialize, max_bytes

logger = logging.getLogger(__name__)

__all__ = ["EvalDataCache", "RecordedBatches", "SingleProcessGather", "deterministic_collator", "eval_dataloader",
           "mark_deterministic", "single_process_gather"]

#: the attribute a transform sets to True to declare that its output depends only on its input batch
DETERMINISTIC_ATTRIBUTE = "deterministic"


def mark_deterministic(transform):
    """Declare ``transform`` (a ``with_transform`` function) deterministic: the same batch in, the same output out,
    no random numbers drawn. Its evaluation batches may then be computed once and kept (:mod:`.eval_data`)."""
    setattr(transform, DETERMINISTIC_ATTRIBUTE, True)
    return transform


def deterministic_collator(collator) -> bool:
    """Whether ``collator`` is one whose batch depends only on its rows (no random numbers): the default collator,
    and transformers' padding collators (exact types: a subclass may add randomness). Unwraps :class:`PreCollated`."""
    from transformers import (
        DataCollatorForLanguageModeling, DataCollatorForSeq2Seq, DataCollatorForTokenClassification,
        DataCollatorWithPadding,
    )

    if isinstance(collator, PreCollated):
        collator = collator.collator
    if is_default_collator(collator):
        return True
    kind = type(collator)
    if kind in (DataCollatorWithPadding, DataCollatorForTokenClassification, DataCollatorForSeq2Seq):
        return True
    return kind is DataCollatorForLanguageModeling and not collator.mlm


def _deterministic_rows(dataset) -> bool:
    """The dataset gives the same rows every read: no transform, or one declared deterministic."""
    if dataset.format.get("type") != "custom":
        return True
    transform = (dataset.format.get("format_kwargs") or {}).get("transform")
    return bool(getattr(transform, DETERMINISTIC_ATTRIBUTE, False))


def _tensor_bytes(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.numel()
    if isinstance(batch, Mapping):
        return sum(_tensor_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(_tensor_bytes(v) for v in batch)
    return 0


def _copy(value: Any) -> Any:
    """A batch as a new mapping of its type (a ``BatchEncoding`` stays one) holding new tensors: a model or loss that
    writes into its inputs cannot reach the cache."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, Mapping):
        return type(value)({k: _copy(v) for k, v in value.items()})
    return value


class RecordedBatches(torch.utils.data.Dataset):
    """The collated batches of a dataset's first read, replayed: ``__getitems__`` (one batch's indices, as the
    sequential sampler gives them) returns a copy of the batch that starts there, in a :class:`CollatedBatch`."""

    def __init__(self, batches: list[Mapping], num_rows: int):
        self.batches = batches
        self.num_rows = num_rows
        self.starts: dict[int, tuple[int, int]] = {}
        start = 0
        for index, batch in enumerate(batches):
            size = _batch_rows(batch)
            self.starts[start] = (index, size)
            start += size
        self.nbytes = _tensor_bytes(batches)

    def __len__(self) -> int:
        return self.num_rows

    def __getitems__(self, indices) -> list[CollatedBatch]:
        index, size = self.starts.get(int(indices[0]), (None, None))
        if index is None or size != len(indices):
            raise RuntimeError("RecordedBatches: asked for rows other than a recorded batch's (the sampler or the "
                               "batch size changed since the batches were recorded).")
        return [CollatedBatch(_copy(self.batches[index]))] * len(indices)


def _batch_rows(batch: Mapping) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
        if isinstance(value, (list, tuple)):
            return len(value)
    raise ValueError("a batch without a tensor or list to count its rows")


class _Entry:
    __slots__ = ("key", "rows", "loader", "nbytes")

    def __init__(self, key, rows, nbytes: int):
        self.key, self.rows, self.nbytes, self.loader = key, rows, nbytes, None


class EvalDataCache:
    """A local Trainer's evaluation sets read once (see the module docstring): dataset -> its rows, or None where
    the Trainer's path is taken for it."""

    def __init__(self):
        self._entries: "weakref.WeakKeyDictionary[Any, _Entry]" = weakref.WeakKeyDictionary()

    @property
    def nbytes(self) -> int:
        """Bytes of every kept evaluation set."""
        return sum(entry.nbytes for entry in list(self._entries.values()))

    def entry(self, trainer, dataset, key) -> _Entry:
        """``dataset``'s entry for ``trainer`` under ``key``, read now if it has none or one under another key: its
        ``rows`` (:class:`~.materialize.TensorRows` or :class:`RecordedBatches`), or None (the Trainer's path)."""
        entry = self._entries.get(dataset)
        if entry is not None and entry.key == key:
            return entry
        if entry is not None:
            del self._entries[dataset]
        rows, nbytes = _read_once(trainer, dataset, max_bytes() - self.nbytes)
        entry = self._entries[dataset] = _Entry(key, rows, nbytes)
        return entry

    def clear(self) -> None:
        self._entries.clear()


def _read_once(trainer, dataset, budget: int) -> tuple[torch.utils.data.Dataset | None, int]:
    """``(rows, bytes kept)``: the rows of ``dataset`` as the evaluation dataloader gives them, read once; rows None
    where that does not apply."""
    if budget <= 0 or not _deterministic_rows(dataset):
        return None, 0
    materialized = materialize(trainer, dataset, budget=budget) if dataset.format.get("type") != "custom" else None
    if materialized is not None:
        return materialized.rows(range(len(dataset))), materialized.nbytes
    recorded = _record_batches(trainer, dataset, budget)
    return (recorded, recorded.nbytes) if recorded is not None else (None, 0)


def _record_batches(trainer, dataset, budget: int) -> RecordedBatches | None:
    """The collated batches of one sequential read of ``dataset`` (the Trainer's columns, batch size, collator and
    ``drop_last``), or None where they would not fit in ``budget`` bytes or the read fails (the Trainer's path then
    reports the error)."""
    args = trainer.args
    rng_state = torch.get_rng_state()  # the read's DataLoader draws a seed the evaluation's own DataLoader draws again
    try:
        pruned = trainer._remove_unused_columns(dataset, description="Evaluation")
        loader = DataLoader(pruned, batch_size=args.eval_batch_size, sampler=SequentialSampler(pruned),
                            collate_fn=trainer.data_collator, drop_last=args.dataloader_drop_last, num_workers=0)
        batches, used, expected = [], 0, len(loader)
        for batch in loader:
            if not isinstance(batch, Mapping):
                return None
            batch = type(batch)({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
            used += _tensor_bytes(batch)
            if used > budget or (len(batches) == 0 and used * expected > budget * 1.5):
                logger.info("Evaluation set not kept: over the budget of %.1f MB (HF_FEDFLAT_MATERIALIZE_MAX_BYTES)",
                            budget / 1e6)
                return None
            batches.append(batch)
    except Exception as error:  # the Trainer's own path raises its own message for the same data
        logger.debug("Evaluation set not kept (%s: %s); the Trainer's path reads it.", type(error).__name__, error)
        return None
    finally:
        torch.set_rng_state(rng_state)
    if not batches:
        return None
    return RecordedBatches(batches, len(pruned))


def _unwrapped(collator):
    return collator.collator if isinstance(collator, PreCollated) else collator


def _overrides(trainer, *names: str) -> bool:
    from transformers import Trainer

    return any(getattr(type(trainer), name) is not getattr(Trainer, name) for name in names)


def eval_dataloader(trainer, dataset, cache: EvalDataCache, description: str = "Evaluation"):
    """A dataloader over ``dataset``'s rows read once (``cache``), giving the batches the Trainer's own
    ``get_eval_dataloader`` / ``get_test_dataloader`` would give; None where that does not apply (the caller then
    takes the Trainer's path). See the module docstring."""
    import datasets

    args = trainer.args
    if not (
        isinstance(dataset, datasets.Dataset) and len(dataset) > 0
        and trainer.accelerator.num_processes == 1 and args.world_size <= 1
        and args.train_sampling_strategy != "group_by_length"
        and not getattr(trainer, "is_fsdp_xla_v2_enabled", False)
        and not _overrides(trainer, "_get_dataloader", "_remove_unused_columns", "_get_eval_sampler")
        and deterministic_collator(trainer.data_collator)
    ):
        return None
    fmt = dataset.format
    key = (dataset._fingerprint, fmt.get("type"), tuple(fmt.get("columns") or ()), fmt.get("output_all_columns"),
           id((fmt.get("format_kwargs") or {}).get("transform")), args.eval_batch_size, args.dataloader_drop_last,
           id(_unwrapped(trainer.data_collator)), args.remove_unused_columns, tuple(trainer.label_names or ()))
    entry = cache.entry(trainer, dataset, key)
    if entry.rows is None:
        return None
    if entry.loader is None:  # one prepared loader per kept set, iterated by every evaluation
        rows = entry.rows
        loader = DataLoader(rows, batch_size=args.eval_batch_size, sampler=SequentialSampler(rows),
                            collate_fn=PreCollated(trainer.data_collator), drop_last=args.dataloader_drop_last,
                            num_workers=0, pin_memory=args.dataloader_pin_memory)
        entry.loader = trainer.accelerator.prepare(loader)
    return entry.loader



class SingleProcessGather:
    """``accelerator.gather_for_metrics`` on one process: each batch's values as they are, and the accelerator's own
    method for the dataloader's last batch (where it drops the rows past the dataset's end).

    On one process ``gather_for_metrics`` gathers nothing (``gather`` and ``gather_object`` return their input) and
    changes a batch only at the end of the dataloader; its checks cost ~40 Python calls a call, three calls a batch
    in the Trainer's evaluation loop (the losses, the logits, the labels): a third of the loop's own calls on
    workload 6's evaluation, where a batch's forward pass is ~0.5 ms."""

    __slots__ = ("accelerator", "gradient_state", "use_gather_object")

    def __init__(self, accelerator, use_gather_object: bool = False):
        self.accelerator, self.gradient_state = accelerator, accelerator.gradient_state
        self.use_gather_object = use_gather_object

    def __call__(self, data, use_gather_object: bool | None = None):
        if self.gradient_state.end_of_dataloader:
            use_object = self.use_gather_object if use_gather_object is None else use_gather_object
            return self.accelerator.gather_for_metrics(data, use_gather_object=use_object)
        return data


def single_process_gather(trainer) -> SingleProcessGather | None:
    """A :class:`SingleProcessGather` for ``trainer``'s evaluation loop, or None where its gather is not the
    accelerator's ``gather_for_metrics`` on one process (several processes, XLA, a gather set by someone else).
    The Trainer starts with ``gather_for_metrics`` bound to ``use_gather_object=args.eval_use_gather_object`` and
    sets it back to the bare method after each evaluation loop: both are recognised."""
    import functools

    from accelerate.utils import DistributedType

    accelerator = trainer.accelerator
    gather, use_object = getattr(trainer, "gather_function", None), False
    if isinstance(gather, functools.partial) and not gather.args and set(gather.keywords) <= {"use_gather_object"}:
        gather, use_object = gather.func, bool(gather.keywords.get("use_gather_object", False))
    if not (accelerator.distributed_type == DistributedType.NO and accelerator.num_processes == 1
            and gather == accelerator.gather_for_metrics):
        return None
    return SingleProcessGather(accelerator, use_object)
