"""Publish a federated run on the Hugging Face Hub: the final model, and checkpoints while it trains.

What is uploaded (built in a staging folder next to the run, then removed):

* a model whose backbone is a plain timm architecture (``vit_*``, ``resnet50``, ... any name of
  ``timm.list_models()`` except hf_fedflat's own ``small_cnn``/``resnet18_gn``) goes up in **timm's
  Hub format at the root** (``config.json`` with ``architecture``/``pretrained_cfg``/``model_args``,
  ``model.safetensors`` with timm's keys, written by ``timm.models.save_for_hf``), and hf_fedflat's
  own files (``save_pretrained`` output + ``federated_config.json``) in the ``hf_fedflat/``
  subfolder. Why this way round: ``timm.create_model("hf-hub:<repo>")`` reads ``config.json`` and
  the weights from the repository root and cannot look into a subfolder, while
  ``from_pretrained(repo, subfolder="hf_fedflat")`` can; both files are named ``config.json`` and
  ``model.safetensors`` and their contents differ (the weight keys of our wrapper carry a
  ``backbone.`` prefix), so they cannot share the root. The root then also loads with transformers'
  ``TimmWrapper`` (``AutoModelForImageClassification``), once ``model_args.num_classes`` is dropped
  from timm's ``config.json`` (it collides with the wrapper's own ``num_classes``; the root
  ``num_classes`` still sets the head for timm).
* any other model (``small_cnn``, ``resnet18_gn``, whose GroupNorm groups and CIFAR stem timm's
  ``config.json`` cannot express, a user's own ``PreTrainedModel``, a peft adapter) goes up as saved:
  its ``save_pretrained`` files at the root.

Both get the model card (``README.md``) with the federated set-up and the two PNGs it embeds.

:class:`HubPushCallback` follows ``TrainingArguments.hub_strategy`` with a checkpoint being a
federated checkpoint (``<output_dir>/checkpoints/round-<k>/``, every ``save_every_n_rounds``):

=====================  =========================================================================
``end``                the final model only, when training ends
``every_save``         also the global model at every checkpoint (in the background)
``checkpoint``         ``every_save`` + the latest checkpoint in ``last-checkpoint/`` (resumable:
                       download it and pass its path as ``resume_from_checkpoint``)
``all_checkpoints``    ``every_save`` + every checkpoint in ``checkpoints/round-<k>/``
=====================  =========================================================================

As in the Trainer, an intermediate push is skipped while the previous one is still uploading,
unless ``hub_always_push``. The token (``hub_token``, else the cached login) is passed to
``huggingface_hub`` calls only: it is never written to a file or a log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from huggingface_hub import HfApi

from ..callbacks import FederatedCallback
from ..models.artifacts import timm_architecture, write_timm_layout
from ..io import COMPLETE_MARKER, verify_complete_dir
from .card import (
    FEDFLAT_SUBFOLDER,
    card_inputs_from_trainer,
    detect_layout,
    write_model_card,
    write_model_card_for_trainer,
)

__all__ = [
    "HubAccessError",
    "HubPushCallback",
    "ModelCardCallback",
    "PushResult",
    "export_for_hub",
    "hub_repo_name",
    "planned_pushes",
    "push_final_model",
    "timm_architecture",
]

logger = logging.getLogger(__name__)

HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")
_STAGING_PREFIX = ".hub-staging-"


class HubAccessError(RuntimeError):
    """The Hub repository of a planned push cannot be created or reached (raised when the trainer is built)."""


@dataclass
class PushResult:
    """What :func:`push_final_model` uploaded: the full repository id, the folder layout, the commit info."""

    repo_id: str
    layout: str
    commit: Any = None


def hub_repo_name(args: Any) -> str:
    """``args.hub_model_id``, else the name of ``args.output_dir`` (the Trainer's rule)."""
    if getattr(args, "hub_model_id", None):
        return str(args.hub_model_id)
    return Path(args.output_dir).absolute().name


def _strategy(args: Any) -> str:
    value = getattr(args, "hub_strategy", "every_save")
    value = getattr(value, "value", value)  # transformers.trainer_utils.HubStrategy
    if value not in HUB_STRATEGIES:
        raise ValueError(f"hub_strategy: must be one of {HUB_STRATEGIES}, got {value!r}.")
    return value


def planned_pushes(strategy: str, round_number: int, save_every_n_rounds: int) -> list[str]:
    """What an intermediate push after ``round_number`` uploads under ``strategy``.

    Returns:
        ``[]`` (nothing), or ``["model"]`` plus, for the checkpoint strategies, the checkpoint's
        path in the repository (``"last-checkpoint"`` or ``"checkpoints/round-<k>"``).
    """
    if strategy not in HUB_STRATEGIES:
        raise ValueError(f"hub_strategy: must be one of {HUB_STRATEGIES}, got {strategy!r}.")
    if strategy == "end" or not save_every_n_rounds or round_number % save_every_n_rounds:
        return []
    if strategy == "checkpoint":
        return ["model", "last-checkpoint"]
    if strategy == "all_checkpoints":
        return ["model", f"checkpoints/round-{round_number}"]
    return ["model"]


def _link_or_copy_tree(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    """Hard-link files (no extra disk, and they survive checkpoint rotation), copying across devices."""

    def link(source, target):
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    shutil.copytree(src, dst, copy_function=link, ignore=shutil.ignore_patterns(*skip) if skip else None,
                    dirs_exist_ok=True)


def export_for_hub(
    model_dir: str | os.PathLike,
    export_dir: str | os.PathLike,
    *,
    data_config: Mapping[str, Any] | None = None,
) -> str:
    """Lay out a saved model folder for upload (see the module docstring).

    Args:
        model_dir: a folder written by ``FederatedTrainer.save_model`` (``save_pretrained`` files and
            ``federated_config.json``; PNGs and a card may be there too).
        export_dir: the folder to fill (created; existing files are overwritten).
        data_config: preprocessing recorded in timm's ``pretrained_cfg`` (``mean``, ``std``,
            ``interpolation``, ``crop_pct``); default: timm's for the architecture.

    Returns:
        The layout written: ``"timm"``, ``"peft"`` or ``"hf_fedflat"``.
    """
    model_dir, export_dir = Path(model_dir), Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    # The card is written anew for the upload; PNGs are copied, not linked, as the card redraws them.
    for png in model_dir.glob("*.png"):
        shutil.copyfile(png, export_dir / png.name)
    if timm_architecture(model_dir) is None:
        _link_or_copy_tree(model_dir, export_dir, skip=("README.md", "*.png", COMPLETE_MARKER))
        return detect_layout(export_dir)

    write_timm_layout(model_dir, export_dir, data_config=data_config)
    _link_or_copy_tree(model_dir, export_dir / FEDFLAT_SUBFOLDER, skip=("README.md", "*.png", COMPLETE_MARKER))
    return "timm"


def push_final_model(
    final_model_dir: str | os.PathLike,
    args: Any,
    *,
    repo_id: str | None = None,
    commit_message: str = "Upload federated model",
    card_inputs: Mapping[str, Any] | None = None,
    data_config: Mapping[str, Any] | None = None,
    api: HfApi | None = None,
    token: str | None = None,
    revision: str | None = None,
    private: bool | None = None,
) -> PushResult:
    """Create the repository (if needed) and upload the model, its card and plots in one commit.

    Args:
        final_model_dir: the saved model (``<output_dir>/final_model``).
        args: the run's ``FedTrainingArguments`` (``hub_model_id``, ``hub_private_repo``, ``hub_token``,
            ``hub_revision``, ``output_dir`` are read; the card reads the federated fields).
        repo_id: overrides ``hub_model_id`` / the output folder's name. Without a namespace the repo is
            created in the token owner's namespace (``create_repo`` returns the full id).
        commit_message: message of the upload commit.
        card_inputs: explicit inputs of :func:`~hf_fedflat.hub.card.build_model_card` (history, partition,
            algorithm, dataset_name, ...); by default the card reads ``history.json``/``partition.json``
            from ``args.output_dir`` and ``federated_config.json`` from the model folder.
        data_config: see :func:`export_for_hub`.
        api: an ``HfApi`` (default: a new one).
        token, revision, private: override ``args.hub_token``, ``args.hub_revision``, ``args.hub_private_repo``.

    Returns:
        :class:`PushResult` with the full repository id, the layout and ``upload_folder``'s commit info.

    Raises:
        FileNotFoundError: When ``final_model_dir`` does not exist.
        hf_fedflat.io.IncompleteSaveError: When a file of ``final_model_dir`` differs from its completion marker
            (``hf_fedflat_complete.json``, written by ``save_model``): a truncated or changed model is not uploaded.
    """
    final_model_dir = Path(final_model_dir)
    if not final_model_dir.is_dir():
        raise FileNotFoundError(f"final_model_dir: {final_model_dir} does not exist; train (or save_model) first.")
    if (final_model_dir / COMPLETE_MARKER).is_file():
        verify_complete_dir(final_model_dir)
    else:
        logger.warning("%s has no %s (not saved by FederatedTrainer.save_model, or an older version): its files are "
                       "uploaded unchecked.", final_model_dir, COMPLETE_MARKER)
    api = api or HfApi()
    token = token or getattr(args, "hub_token", None)
    private = private if private is not None else getattr(args, "hub_private_repo", None)
    repo_url = api.create_repo(repo_id=repo_id or hub_repo_name(args), private=private, token=token, exist_ok=True)
    full_id = repo_url.repo_id
    with _staging_dir(args.output_dir) as staging:
        layout = export_for_hub(final_model_dir, staging, data_config=data_config)
        inputs = {"output_dir": args.output_dir, **(card_inputs or {}), "layout": layout, "repo_id": full_id}
        inputs.pop("args", None)
        write_model_card(staging, args, **inputs)
        commit = api.upload_folder(
            repo_id=full_id, folder_path=os.fspath(staging), commit_message=commit_message, token=token,
            revision=revision or getattr(args, "hub_revision", None),
        )
    logger.info("Pushed the federated model to https://huggingface.co/%s (%s layout)", full_id, layout)
    return PushResult(repo_id=full_id, layout=layout, commit=commit)


@contextlib.contextmanager
def _staging_dir(output_dir: str | os.PathLike):
    path = _new_staging_dir(output_dir)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _new_staging_dir(output_dir: str | os.PathLike) -> Path:
    # Inside the run's folder: the same file system as the checkpoints, so hard links work.
    os.makedirs(output_dir, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=output_dir))


@contextlib.contextmanager
def _checkpoint_weights(trainer, checkpoint_dir: Path):
    """Load a checkpoint's global weights into the live model, and put the previous ones back."""
    from safetensors.torch import load_file

    import torch

    saved = load_file(os.fspath(checkpoint_dir / "global_params.safetensors"))
    space, buffer_space = trainer.space, getattr(trainer, "buffer_space", None)
    before = space.flatten()
    before_buffers = buffer_space.flatten() if buffer_space is not None else None
    space.load_(torch.cat([saved[name].reshape(-1) for name in space.names]))
    if buffer_space is not None and all(name in saved for name in buffer_space.names):
        buffer_space.load_(torch.cat([saved[name].reshape(-1) for name in buffer_space.names]))
    try:
        yield
    finally:
        space.load_(before)
        if buffer_space is not None:
            buffer_space.load_(before_buffers)


class ModelCardCallback(FederatedCallback):
    """Writes ``final_model/README.md`` (the model card) at the end of every run, pushed or not (every
    trainer adds it ahead of the user's callbacks, so a :class:`HubPushCallback` finds the card)."""

    def on_train_end(self, trainer, history: list[dict], **kwargs: Any) -> None:
        write_model_card_for_trainer(trainer, kwargs.get("final_model_dir"))


class HubPushCallback(FederatedCallback):
    """Push to the Hub while a federated run trains (per ``hub_strategy``) and when it ends.

    Add it to ``FederatedTrainer(callbacks=[...])``; it runs on the main process only (the trainer
    calls round-end hooks there). Intermediate pushes upload in a background thread, one at a time and
    in order; the final push waits for them, then uploads the final model synchronously.

    Args:
        card_kwargs: extra card inputs (``dataset_name``, ``dataset_id``, ``base_model``, ``license``,
            ``tags``); they complement the trainer's ``model_card_kwargs``.
        data_config: preprocessing for timm's ``pretrained_cfg`` (see :func:`export_for_hub`).
        api: an ``HfApi`` (default: a new one).
    """

    def __init__(self, *, card_kwargs: Mapping[str, Any] | None = None, data_config: Mapping[str, Any] | None = None,
                 api: HfApi | None = None):
        self.card_kwargs = dict(card_kwargs or {})
        self.data_config = dict(data_config) if data_config else None
        self.api = api
        self.repo_id: str | None = None
        self.result: PushResult | None = None
        self.error: BaseException | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._jobs: list[tuple[int, Future]] = []

    # ------------------------------------------------------------------------------------------
    def _api(self) -> HfApi:
        if self.api is None:
            self.api = HfApi()
        return self.api

    def _ensure_repo(self, args) -> str:
        if self.repo_id is None:
            repo_url = self._api().create_repo(repo_id=hub_repo_name(args), private=getattr(args, "hub_private_repo", None),
                                               token=getattr(args, "hub_token", None), exist_ok=True)
            self.repo_id = repo_url.repo_id
        return self.repo_id

    def prepare_repo(self, args) -> str:
        """Create (or reach) the repository before training, as ``Trainer`` does when built with ``push_to_hub``:
        the full repo id, or :class:`HubAccessError` naming the repo and what to check (nothing trained yet)."""
        try:
            return self._ensure_repo(args)
        except Exception as error:
            offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
            raise HubAccessError(
                f"push_to_hub: cannot create or reach the Hub repository {hub_repo_name(args)!r} "
                f"({type(error).__name__}: {error}). {'HF_HUB_OFFLINE is set. ' if offline else ''}Check "
                "hub_model_id, the network and the token (HF_TOKEN or `hf auth login`; hub_token), or run without "
                "push_to_hub. Checked before the first round: nothing was trained."
            ) from error

    def _card_inputs(self, trainer) -> dict[str, Any]:
        inputs = card_inputs_from_trainer(trainer)
        inputs.update(self.card_kwargs)
        inputs.pop("args", None)
        return inputs

    def _busy(self) -> bool:
        return any(not job.done() for _, job in self._jobs)

    # ------------------------------------------------------------------------------------------
    def on_round_end(self, trainer, round_index: int, record: dict, **kwargs: Any) -> None:
        args = trainer.args
        round_number = round_index + 1
        plan = planned_pushes(_strategy(args), round_number, int(getattr(args, "save_every_n_rounds", 0) or 0))
        if not plan:
            return
        checkpoint = Path(args.output_dir) / "checkpoints" / f"round-{round_number}"
        if not (checkpoint / "global_params.safetensors").is_file():
            logger.warning("Hub push after round %d skipped: no checkpoint at %s.", round_number, checkpoint)
            return
        if self._busy() and not getattr(args, "hub_always_push", False):
            logger.info("Hub push after round %d skipped: the previous push is still uploading "
                        "(set hub_always_push to queue every push).", round_number)
            return
        repo_id = self._ensure_repo(args)
        staging = _new_staging_dir(args.output_dir)
        try:
            with _checkpoint_weights(trainer, checkpoint):
                trainer.save_model(os.fspath(staging / "model"))
            layout = export_for_hub(staging / "model", staging / "upload", data_config=self.data_config)
            write_model_card(staging / "upload", args, **{"output_dir": args.output_dir, **self._card_inputs(trainer),
                                                          "layout": layout, "repo_id": repo_id})
            uploads = [(staging / "upload", None, f"Training in progress, round {round_number}")]
            for path_in_repo in plan[1:]:
                _link_or_copy_tree(checkpoint, staging / "checkpoint")
                uploads.append((staging / "checkpoint", path_in_repo, f"Training in progress, round {round_number}, checkpoint"))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hub-push")
        self._jobs.append((round_number, self._executor.submit(self._upload, repo_id, args, uploads, staging)))

    def _upload(self, repo_id: str, args, uploads, staging: Path) -> list[Any]:
        try:
            return [
                self._api().upload_folder(repo_id=repo_id, folder_path=os.fspath(folder), path_in_repo=path_in_repo,
                                          commit_message=message, token=getattr(args, "hub_token", None),
                                          revision=getattr(args, "hub_revision", None))
                for folder, path_in_repo, message in uploads
            ]
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def wait(self) -> None:
        """Wait for the background pushes; a failed one is logged (the final push still runs)."""
        for round_number, job in self._jobs:
            error = job.exception()
            if error is not None:
                logger.warning("Hub push after round %d failed: %s: %s", round_number, type(error).__name__, error)
        self._jobs.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def on_train_end(self, trainer, history: list[dict], **kwargs: Any) -> None:
        """Push the final model. A failure is raised in a one-process run; with several processes it is
        logged instead (``self.error``), since the other processes wait for this one at the final barrier."""
        self.wait()
        args = trainer.args
        final_dir = Path(args.output_dir) / "final_model"
        try:
            self.result = push_final_model(
                final_dir, args, repo_id=self._ensure_repo(args), commit_message="End of training",
                card_inputs=self._card_inputs(trainer), data_config=self.data_config, api=self._api(),
            )
        except Exception as error:
            if getattr(getattr(trainer, "comm", None), "world_size", 1) <= 1:
                raise
            self.error = error
            logger.error("Pushing the final model failed (%s: %s). The model is saved in %s; retry with "
                         "hf_fedflat.hub.push_final_model(%r, args).", type(error).__name__, error, final_dir,
                         str(final_dir))
