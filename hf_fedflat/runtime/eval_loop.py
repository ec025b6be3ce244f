"""The lean evaluation loop (mechanism ``eval_loop``): ``Trainer.evaluation_loop`` over an evaluation set read once
(:mod:`.eval_data`), on one process, without the per-batch work that does nothing there.

With the rows read once, an evaluation of a small model is its forward passes plus the Trainer's loop around them:
per batch, a step of accelerate's ``DataLoaderShard`` over torch's ``DataLoader`` (sampler, fetch, collate, the device
copy), two ``pad_across_processes`` and three ``gather_for_metrics`` calls that change nothing on one process. On
workload 6's evaluation (1,797 rows in 15 batches of a 4.9k-parameter CNN) that loop cost more than the forward
passes a plain loop makes, and a decentralized round evaluates eleven models (``benchmarks/whole_run.py`` rows (a) and
(c)). This loop reads each batch straight from the kept rows, or from a random transform's rows
(:mod:`.transform_rows`), the same batches in the same order through the same collator pass-through and device copy,
each read before the previous one is used, as the ``DataLoaderShard`` reads them; it keeps the ``DataLoaderShard``'s
bookkeeping (its gradient-state entry, the
end-of-dataloader flag and remainder, its iteration count, the base seed the ``DataLoader`` iterator draws from
torch's global generator), and runs the rest of the Trainer's loop as the Trainer does: its ``prediction_step``
(overridable), ``preprocess_logits_for_metrics``, the ``on_prediction_step`` event, its ``EvalLoopContainer``s,
the accelerator's ``gather_for_metrics`` on the last batch (which drops the rows past the dataset's end),
``compute_metrics``, the NaN filter, ``eval_loss`` and the key prefix. The metrics, predictions and labels are the
Trainer's value for value (``tests/runtime/test_eval_loop.py``).

It is used only where :func:`applies` says so: the dataloader is one :mod:`.eval_data` or :mod:`.transform_rows`
made (rows read once or a transform's rows read per batch, a sequential sampler, no workers, no pinned memory, no
stateful loader), one process (no DeepSpeed, FSDP or XLA), the model already prepared, no ``fp16_full_eval`` /
``bf16_full_eval``, no ``batch_eval_metrics``, ``eval_accumulation_steps`` or ``include_for_metrics``; anything else
runs the Trainer's loop. Relies on private ``transformers`` / ``accelerate``
API (``EvalLoopContainer``, ``DataLoaderShard.begin`` / ``end``, ``_wrap_model``); pyproject pins both.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch.utils.data import SequentialSampler

from .eval_data import RecordedBatches, single_process_gather
from .materialize import PreCollated, TensorRows
from .transform_rows import TransformedRows

__all__ = ["applies", "run"]


def applies(trainer, dataloader) -> bool:
    """Whether :func:`run` does all ``Trainer.evaluation_loop`` would for ``dataloader`` (see the module docstring)."""
    from accelerate.data_loader import DataLoaderShard
    from transformers.utils import is_torch_xla_available

    args = trainer.args
    base = getattr(dataloader, "base_dataloader", None)
    return (
        type(dataloader) is DataLoaderShard and base is not None
        and type(dataloader.dataset) in (TensorRows, RecordedBatches, TransformedRows)
        and isinstance(dataloader.collate_fn, PreCollated)
        and type(dataloader.batch_sampler.sampler) is SequentialSampler
        and dataloader.batch_sampler.batch_size == args.eval_batch_size
        and dataloader.num_workers == 0 and base.generator is None
        and not (dataloader.pin_memory and torch.cuda.is_available())
        and not getattr(dataloader, "use_stateful_dataloader", False) and dataloader.skip_batches == 0
        and single_process_gather(trainer) is not None
        and not (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled
                 or getattr(trainer, "is_fsdp_xla_enabled", False))
        and not is_torch_xla_available()
        and len(trainer.accelerator._models) > 0  # else the Trainer's loop prepares the model first
        and trainer._wrap_model(trainer.model, training=False) is trainer.model
        and not (args.fp16_full_eval or args.bf16_full_eval)
        and not args.batch_eval_metrics and args.eval_accumulation_steps is None
        and not args.include_for_metrics
    )


def _batches(dataloader):
    """The batches the ``DataLoaderShard`` yields, with its bookkeeping: ``(inputs, is_last)``. Each batch is read
    before the previous one is yielded, as the ``DataLoaderShard`` reads them (a transform drawing random numbers, in
    :class:`~.transform_rows.TransformedRows`, draws them at the same points)."""
    from accelerate.utils import send_to_device

    rows, size, drop_last = dataloader.dataset, dataloader.batch_sampler.batch_size, dataloader.batch_sampler.drop_last
    n = len(rows)
    stops = range(0, n - n % size if drop_last else n, size)
    if type(rows) is TensorRows and type(dataloader.collate_fn) is PreCollated:
        # what ``__getitems__`` and the pass-through collator give, without a list of the batch's positions
        read = lambda start: rows.materialized.collate(rows.indices[start:min(start + size, n)])  # noqa: E731
    else:
        read = lambda start: dataloader.collate_fn(rows.__getitems__(list(range(start, min(start + size, n)))))  # noqa
    dataloader.begin()  # (the remainder of the last batch, the gradient state's active dataloader)
    try:
        dataloader.set_epoch(dataloader.iteration)
        torch.empty((), dtype=torch.int64).random_()  # the DataLoader iterator's base seed, drawn as it draws it
        if not stops:
            return
        current = read(stops[0])
        for start in stops[1:]:
            if dataloader.device is not None:
                current = send_to_device(current, dataloader.device, non_blocking=dataloader._non_blocking)
            following = read(start)
            yield current, False
            current = following
        if dataloader.device is not None:
            current = send_to_device(current, dataloader.device, non_blocking=dataloader._non_blocking)
        dataloader.end_of_dataloader = True
        yield current, True
        dataloader.iteration += 1
    finally:
        dataloader.end()


def _add_all(container, batches: list) -> None:
    """``container.add`` of each of ``batches`` in turn. Where each is a tensor of one dtype and one shape past the
    first dimension, that concatenation is ``torch.cat`` of each pair: one ``torch.cat`` of them all gives the same
    tensor, without a growing copy and a walk of ``nested_concat`` per batch."""
    first = batches[0] if batches else None
    if (container.do_nested_concat and container.tensors is None and len(batches) > 1
            and all(type(t) is torch.Tensor and t.dim() > 0 and t.dtype == first.dtype and t.device == first.device
                    and t.shape[1:] == first.shape[1:] for t in batches)):
        container.add(torch.cat(batches))
        return
    for batch in batches:
        container.add(batch)


def run(trainer, dataloader, description: str, prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"):
    """``Trainer.evaluation_loop(dataloader, ...)`` for a configuration :func:`applies` accepted."""
    from transformers.trainer import logger as trainer_logger
    from transformers.trainer_pt_utils import EvalLoopContainer, find_batch_size
    from transformers.trainer_utils import EvalLoopOutput, EvalPrediction, denumpify_detensorize

    args = trainer.args
    prediction_loss_only = prediction_loss_only if prediction_loss_only is not None else args.prediction_loss_only
    model = trainer._wrap_model(trainer.model, training=False)
    batch_size = args.eval_batch_size
    if trainer_logger.isEnabledFor(logging.INFO):
        trainer_logger.info(f"\n***** Running {description} *****")
        trainer_logger.info(f"  Num examples = {trainer.num_examples(dataloader)}")
        trainer_logger.info(f"  Batch size = {batch_size}")
    if hasattr(model, "eval") and callable(model.eval):
        model.eval()
    if hasattr(trainer.optimizer, "eval") and callable(trainer.optimizer.eval):
        trainer.optimizer.eval()
    trainer.callback_handler.eval_dataloader = dataloader
    eval_dataset = dataloader.dataset
    all_losses = EvalLoopContainer(args.eval_do_concat_batches, padding_index=-100)
    all_preds = EvalLoopContainer(args.eval_do_concat_batches, padding_index=-100)
    all_labels = EvalLoopContainer(args.eval_do_concat_batches, padding_index=-100)
    gather = trainer.gather_function  # the accelerator's, for the last batch (one process: nothing else changes)
    observed_num_examples = 0
    batch_losses, batch_preds, batch_labels = [], [], []  # added to the containers after the loop (_add_all)
    for inputs, last in _batches(dataloader):
        observed_batch_size = find_batch_size(inputs)
        if observed_batch_size is not None:
            observed_num_examples += observed_batch_size
        losses, logits, labels = trainer.prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        # (pad_across_processes pads to the longest batch of all processes: on one process, the batch itself)
        if losses is not None:
            losses = losses.repeat(batch_size)
            batch_losses.append(gather(losses) if last else losses)
        if logits is not None:
            if trainer.preprocess_logits_for_metrics is not None:
                logits = trainer.preprocess_logits_for_metrics(logits, labels)
            batch_preds.append(gather(logits) if last else logits)
        if labels is not None:
            batch_labels.append(gather(labels) if last else labels)
        trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)
    for container, batches in ((all_losses, batch_losses), (all_preds, batch_preds), (all_labels, batch_labels)):
        _add_all(container, batches)
    trainer.gather_function = trainer.accelerator.gather_for_metrics  # as the Trainer's loop leaves it

    all_losses, all_preds, all_labels = all_losses.get_arrays(), all_preds.get_arrays(), all_labels.get_arrays()
    num_samples = len(eval_dataset)
    if num_samples == 0 and observed_num_examples > 0:
        num_samples = observed_num_examples
    metrics = None
    if trainer.compute_metrics is not None and all_preds is not None and all_labels is not None:
        metrics = trainer.compute_metrics(EvalPrediction(predictions=all_preds, label_ids=all_labels, losses=None,
                                                         inputs=None))
    elif metrics is None:
        metrics = {}
    metrics = denumpify_detensorize(metrics)
    losses = np.concatenate(all_losses) if isinstance(all_losses, list) and all_losses else all_losses
    if isinstance(losses, np.ndarray):
        finite = np.isfinite(losses)
        if args.logging_nan_inf_filter and finite.any():
            losses = losses[finite]
        metrics[f"{metric_key_prefix}_loss"] = losses.mean().item()
    if hasattr(trainer, "model_preparation_time"):
        metrics[f"{metric_key_prefix}_model_preparation_time"] = trainer.model_preparation_time
    for key in list(metrics.keys()):
        if not key.startswith(f"{metric_key_prefix}_"):
            metrics[f"{metric_key_prefix}_{key}"] = metrics.pop(key)
    return EvalLoopOutput(predictions=all_preds, label_ids=all_labels, metrics=metrics, num_samples=num_samples)
