"""The ``transformers.Trainer``-shaped part of :class:`~hf_fedflat.federation.trainer.FederatedTrainer`.

A script written for ``Trainer`` reads the same with the federated trainer::

    trainer = FederatedTrainer(model, args, train_dataset, eval_dataset)
    result = trainer.train()                       # .metrics, .training_loss, .global_step (= rounds done)
    trainer.log_metrics("train", result.metrics); trainer.save_metrics("train", result.metrics)
    trainer.save_state()                           # trainer_state.json: log_history = one record per round
    metrics = trainer.evaluate(eval_dataset=other, metric_key_prefix="other")
    prediction = trainer.predict(test_dataset)     # PredictionOutput(predictions, label_ids, metrics)
    trainer.save_model()                           # <output_dir>/final_model
    trainer.push_to_hub(commit_message="...")

What differs, because the unit of federated training is a round: ``state.global_step`` and
``TrainOutput.global_step`` count rounds; ``state.log_history`` holds ``history.json``'s records (each with
``step`` = its round), then the run's summary and the logs of later ``evaluate`` calls; ``evaluate``,
``predict`` and ``save_model`` use the weights the model holds (the final global model once ``train()``
returned, the initial one before). ``transformers.TrainerCallback`` instances are accepted by
:meth:`TrainerAPI.add_callback` and run through :class:`TrainerCallbackAdapter` (a round is a step).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import torch
from transformers.trainer_callback import TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_pt_utils import log_metrics, metrics_format, save_metrics, save_state
from transformers.trainer_utils import PredictionOutput

from ..callbacks import FederatedCallback

logger = logging.getLogger(__name__)

__all__ = ["TrainerAPI", "TrainerCallbackAdapter", "train_metrics"]

#: timing entries of ``Trainer.evaluate`` that are not metrics of the model
_TIMINGS = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


def train_metrics(history: list[dict]) -> dict[str, float]:
    """``TrainOutput.metrics`` of a federated run, from its per-round records.

    ``train_loss``: mean over the rounds that aggregated clients of their ``train_loss`` (each round's is the
    clients' weighted mean, as in ``history.json``); ``train_runtime``: the run's wall seconds (resumed runs
    included); ``train_rounds``: rounds done; ``train_failed_rounds``: rounds that aggregated no client;
    ``train_local_steps``: optimizer steps of all clients in all rounds; and the last evaluated round's
    ``eval_*`` metrics, under their ``history.json`` names.
    """
    if not history:
        return {}
    trained = [r for r in history if "train_loss" in r]
    metrics = {
        "train_runtime": float(history[-1].get("wall_seconds", math.nan)),
        "train_loss": float(sum(r["train_loss"] for r in trained) / len(trained)) if trained else math.nan,
        "train_rounds": int(history[-1]["round"]),
        "train_failed_rounds": sum(1 for r in history if "round_failed" in r),
        "train_local_steps": float(sum(r.get("local_steps", 0.0) * r.get("num_clients", 0) for r in trained)),
    }
    evaluated = [r for r in history if any(k.startswith("eval_") for k in r)]
    if evaluated:
        last = evaluated[-1]
        metrics.update({k: v for k, v in last.items() if k.startswith("eval_") and isinstance(v, (int, float))})
    return metrics


class TrainerCallbackAdapter(FederatedCallback):
    """Runs a ``transformers.TrainerCallback`` in the federated loop, a round being a step.

    ``on_train_begin`` / ``on_train_end`` map to themselves; ``on_round_begin`` to ``on_step_begin``;
    ``on_round_end`` to ``on_step_end``, then ``on_log`` (``logs`` = the round's record) and, on an evaluated
    round, ``on_evaluate`` (``metrics`` = its ``eval_*`` entries). The ``state`` passed is the trainer's
    :attr:`TrainerAPI.state`. Setting ``control.should_training_stop`` is not honoured (the loop runs
    ``num_rounds`` rounds): it is logged once.
    """

    def __init__(self, callback: TrainerCallback):
        self.callback = callback
        self.control = TrainerControl()
        self._warned = False

    def _call(self, trainer, event: str, **kwargs: Any) -> None:
        method = getattr(self.callback, event, None)
        if method is None:
            return
        result = method(trainer.args, trainer.state, self.control, model=trainer.model,
                        processing_class=getattr(trainer.client_trainer, "processing_class", None), **kwargs)
        if isinstance(result, TrainerControl):
            self.control = result
        if self.control.should_training_stop and not self._warned:
            self._warned = True
            logger.warning("%s asked to stop training; the federated loop runs all %d rounds (stop early with "
                           "num_rounds or max_consecutive_failed_rounds).", type(self.callback).__name__,
                           trainer.args.num_rounds)

    def on_train_begin(self, trainer, **kwargs: Any) -> None:
        self._call(trainer, "on_train_begin")

    def on_round_begin(self, trainer, round_index: int, clients: list[int], **kwargs: Any) -> None:
        if trainer.comm.is_main:  # (round-begin hooks run on every process; a TrainerCallback expects rank 0 only)
            self._call(trainer, "on_step_begin")

    def on_round_end(self, trainer, round_index: int, record: dict, **kwargs: Any) -> None:
        self._call(trainer, "on_step_end")
        self._call(trainer, "on_log", logs=dict(record))
        evaluated = {k: v for k, v in record.items() if k.startswith("eval_")}
        if evaluated:
            self._call(trainer, "on_evaluate", metrics=evaluated)

    def on_train_end(self, trainer, history: list[dict], **kwargs: Any) -> None:
        self._call(trainer, "on_train_end")


class TrainerAPI:
    """``Trainer``'s public surface on top of a federated trainer (see the module docstring).

    The class using it provides ``args``, ``comm``, ``model``, ``client_trainer``, ``callbacks``,
    ``history``, ``eval_dataset``, ``load_weights`` and ``save_model``.
    """

    # transformers' own helpers, as Trainer binds them (they read self.args, self.state, is_world_process_zero)
    log_metrics = log_metrics
    metrics_format = metrics_format
    save_metrics = save_metrics
    save_state = save_state

    #: the run's summary and later ``evaluate`` logs, after the per-round records in ``state.log_history``
    _extra_logs: list[dict]

    def _init_trainer_api(self) -> None:
        self._extra_logs = []
        self.hub_push_result = None

    # -------------------------------------------------------------------------------------- state
    def is_world_process_zero(self) -> bool:
        return self.comm.is_main

    def is_local_process_zero(self) -> bool:
        return self.comm.is_main

    @property
    def log_history(self) -> list[dict]:
        """``history.json``'s records, each with ``step`` (its round); then the run's summary (``train()``'s
        metrics) and the logs of ``evaluate`` calls made since, in order."""
        return [{**record, "step": record["round"]} for record in self.history] + [dict(x) for x in self._extra_logs]

    @property
    def state(self) -> TrainerState:
        """A ``transformers.TrainerState`` of the run, built from its history on each access.

        ``global_step``: rounds done; ``max_steps``: ``num_rounds``; ``epoch``: rounds done (a round is one
        pass of the sampled clients); ``log_history``: :attr:`log_history`; ``best_metric`` /
        ``best_global_step`` per ``metric_for_best_model`` (``eval_`` prefixed when it is not) and
        ``greater_is_better``, over the evaluated rounds.
        """
        args, rounds = self.args, (self.history[-1]["round"] if self.history else 0)
        state = TrainerState(
            epoch=float(rounds), global_step=rounds, max_steps=args.num_rounds, logging_steps=1,
            eval_steps=args.eval_every_n_rounds, save_steps=args.save_every_n_rounds or 0,
            train_batch_size=args.per_device_train_batch_size, num_train_epochs=args.num_rounds,
            log_history=self.log_history, is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
        )
        name = args.metric_for_best_model
        if name:
            key = name if name.startswith("eval_") else f"eval_{name}"
            scored = [(r[key], r["round"]) for r in self.history if isinstance(r.get(key), (int, float))]
            if scored:
                greater = args.greater_is_better if args.greater_is_better is not None else not key.endswith("loss")
                best = max(scored, key=lambda s: (s[0] if greater else -s[0], -s[1]))
                state.best_metric, state.best_global_step = float(best[0]), int(best[1])
        return state

    def _record_train_summary(self, metrics: dict[str, float]) -> None:
        if metrics:
            self._extra_logs.append({**metrics, "step": int(metrics["train_rounds"])})

    # -------------------------------------------------------------------------------------- callbacks
    def add_callback(self, callback) -> None:
        """Add a :class:`FederatedCallback` or a ``transformers.TrainerCallback`` (class or instance), run after
        the callbacks already there (a Hub push stays last)."""
        callback = callback() if isinstance(callback, type) else callback
        if isinstance(callback, TrainerCallback):
            callback = TrainerCallbackAdapter(callback)
        elif not isinstance(callback, FederatedCallback):
            raise TypeError(f"add_callback: expected a FederatedCallback or a transformers.TrainerCallback, got "
                            f"{type(callback).__name__}.")
        from ..hub.push import HubPushCallback

        pushes = [i for i, c in enumerate(self.callbacks) if isinstance(c, HubPushCallback)]
        if pushes and not isinstance(callback, HubPushCallback):
            self.callbacks.insert(pushes[0], callback)
        else:
            self.callbacks.append(callback)

    def pop_callback(self, callback):
        """Remove ``callback`` (an instance, or the first of a class) and return it; ``None`` when absent.
        A ``TrainerCallback`` added through :meth:`add_callback` is found by itself or by its class."""
        for index, present in enumerate(self.callbacks):
            inner = present.callback if isinstance(present, TrainerCallbackAdapter) else present
            if (isinstance(callback, type) and isinstance(inner, callback)) or callback is inner or callback is present:
                del self.callbacks[index]
                return inner
        return None

    def remove_callback(self, callback) -> None:
        """Like :meth:`pop_callback`, without returning it."""
        self.pop_callback(callback)

    # -------------------------------------------------------------------------------------- evaluation
    def evaluate(self, eval_dataset=None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval",
                 **legacy: Any) -> dict[str, float]:
        """``Trainer.evaluate`` on the weights the model holds (the final global model after ``train()``).

        Args:
            eval_dataset: a dataset, or a dict of them (each evaluated with prefix
                ``f"{metric_key_prefix}_{name}"``); default: the trainer's ``eval_dataset``.
            ignore_keys, metric_key_prefix: as for ``Trainer.evaluate``.

        Returns:
            The Trainer's metrics (``<prefix>_loss``, ``<prefix>_accuracy``, timings, ...) and ``round`` (rounds
            done; the local Trainer's ``epoch`` is left out: it means nothing for the global model); also appended to
            :attr:`log_history`. (A tensor as ``eval_dataset`` is the former form: the metrics of those weights,
            see :meth:`evaluate_weights`.)
        """
        if isinstance(eval_dataset, torch.Tensor):  # the former evaluate(params, dataset=None, buffers=None)
            return self.evaluate_weights(eval_dataset, legacy.get("buffers"), legacy.get("dataset"))
        if legacy:
            raise TypeError(f"evaluate() got unexpected keyword arguments {sorted(legacy)}")
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate: no eval_dataset given and the trainer has none.")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        metrics = self._with_round(self.client_trainer.evaluate(eval_dataset=dataset, ignore_keys=ignore_keys,
                                                                metric_key_prefix=metric_key_prefix))
        self._extra_logs.append({**metrics, "step": metrics["round"]})
        return metrics

    def _with_round(self, metrics: dict) -> dict:
        """``metrics`` with the rounds done as ``round`` instead of the local Trainer's ``epoch`` (the fraction of
        an epoch of the last client's data, meaningless for the global model)."""
        metrics = {k: v for k, v in metrics.items() if k != "epoch"}
        metrics["round"] = self.history[-1]["round"] if self.history else 0
        return metrics

    def evaluate_weights(self, params: torch.Tensor | None = None, buffers: torch.Tensor | None = None,
                         dataset=None) -> dict[str, float]:
        """``eval_*`` metrics (timings left out) of ``params`` (default: the current weights) on ``dataset``
        (default: ``eval_dataset``); ``{}`` without data. Loads ``params`` into the model. (The round loop's.)"""
        if params is not None:
            self.load_weights(params, buffers)
        dataset = dataset if dataset is not None else self.eval_dataset
        if dataset is None:
            return {}
        metrics = self.client_trainer.evaluate(eval_dataset=dataset, metric_key_prefix="eval")
        return {k: float(v) for k, v in metrics.items() if k.startswith("eval_") and not k.endswith(_TIMINGS)}

    def predict(self, test_dataset, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """``Trainer.predict`` on the weights the model holds: ``PredictionOutput(predictions, label_ids,
        metrics)`` (metrics prefixed ``test_`` by default, and ``round`` as in :meth:`evaluate`; ``compute_metrics``
        is the trainer's)."""
        output = self.client_trainer.predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        return output._replace(metrics=self._with_round(output.metrics or {}))

    # -------------------------------------------------------------------------------------- Hub
    def _check_hub_push(self) -> None:
        """With a Hub push planned (``push_to_hub`` or a :class:`~hf_fedflat.hub.HubPushCallback`), create or
        reach the repository now, as ``Trainer`` does when built: a missing token, a wrong repo id or no
        network fail before the first round (:class:`~hf_fedflat.hub.push.HubAccessError`)."""
        from ..hub.push import HubPushCallback

        if not self.comm.is_main:
            return
        for callback in self.callbacks:
            if isinstance(callback, HubPushCallback):
                callback.prepare_repo(self.args)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any):
        """Upload the run's final model (``<output_dir>/final_model``, saved now with its card when the run has
        none yet) to ``hub_model_id`` (else the output folder's name), as ``Trainer.push_to_hub`` does.

        Args:
            commit_message, token, revision, private: as for ``Trainer.push_to_hub`` (default: ``hub_token``,
                ``hub_revision``, ``hub_private_repo``).
            blocking: the upload always completes before this returns.
            kwargs: ``repo_id``, ``card_kwargs`` (extra model-card inputs), ``data_config``, ``api`` (an
                ``HfApi``; default: the one of the trainer's ``HubPushCallback``, else a new one).

        Returns:
            The upload's commit info (main process; ``None`` elsewhere). The full result
            (:class:`~hf_fedflat.hub.PushResult`: repo id, layout) is kept in ``self.hub_push_result``.
        """
        from ..hub.card import card_inputs_from_trainer, write_model_card_for_trainer
        from ..hub.push import HubPushCallback, push_final_model

        if not self.comm.is_main:
            return None
        final_dir = os.path.join(self.args.output_dir, "final_model")
        if not os.path.isdir(final_dir):
            self.save_model(final_dir)
            write_model_card_for_trainer(self, final_dir)
        pusher = next((c for c in self.callbacks if isinstance(c, HubPushCallback)), None)
        api = kwargs.get("api") or (pusher.api if pusher is not None else None)
        inputs = {**card_inputs_from_trainer(self), **(pusher.card_kwargs if pusher is not None else {}),
                  **(kwargs.get("card_kwargs") or {})}
        inputs.pop("args", None)
        data_config = kwargs.get("data_config") or (pusher.data_config if pusher is not None else None)
        self.hub_push_result = push_final_model(
            final_dir, self.args, repo_id=kwargs.get("repo_id") or (pusher.repo_id if pusher is not None else None),
            commit_message=commit_message or "End of training", card_inputs=inputs, data_config=data_config, api=api,
            token=token, revision=revision, private=private,
        )
        return self.hub_push_result.commit
