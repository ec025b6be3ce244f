"""``FedTrainingArguments``: every setting of a federated run, validated before anything loads.

The fields are declared beside their concept and composed here with :func:`include_fields`:

* each piece's hyperparameters (``rho``, ``prox_mu``, ``topology``, ...) in its config dataclass, merged by the
  registry (:func:`hf_fedflat.algorithms.registry.hyperparameter_fields`; unset = ``None``);
* the partition in :mod:`hf_fedflat.data.arguments`, the diagnostics in :mod:`hf_fedflat.diagnostics.arguments`,
  the client-state store in :mod:`hf_fedflat.state.arguments`, clients trained at once in
  :mod:`hf_fedflat.runtime.arguments`;
* the federation's own fields (clients, rounds, local work, faulty clients, checkpoints) below.

``__post_init__`` resolves unset hyperparameters (the preset's default, then the active piece's own), runs every
concept's and every piece's ``validate()`` and the checks across concepts; a bad value raises a ``ValueError``
that starts with the field's name. It does not open the process group: entry points call
``hf_fedflat.init_process_group()`` first (see :mod:`hf_fedflat.federation.comm`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from .algorithms import SharpnessAware, get_preset, resolve_parts
from .algorithms.conflicts import DECENTRALIZED_RUN_FIELDS
from .algorithms.optimizers import plain_sgd_presets, resolve_local_optimizer
from .algorithms.registry import (
    AGGREGATOR_PLUGINS,
    AGGREGATORS,
    CORRECTIONS,
    PERTURBATIONS,
    hyperparameter_fields,
    split_plugins,
)
from .data.arguments import PartitionArguments
from .diagnostics.arguments import DiagnosticsArguments, parse_diagnostics
from .runtime.arguments import ConcurrencyArguments
from .state.arguments import ClientStateArguments
from .trainer_fields import check_trainer_fields
from .field_checks import check_choice, check_integer, check_number, fail

__all__ = ["FedTrainingArguments", "include_fields"]

logger = logging.getLogger(__name__)

AGGREGATION_WEIGHTS = ("samples", "uniform")
DECENTRALIZED_PARTICIPATION = ("full", "sampled")
BATCHNORM_BUFFERS = ("error", "average")
DEFAULT_PARTICIPATION = 0.1
#: Hyperparameters the run itself reads even when no active piece declares them, and their value then:
#: ``rho`` is also the radius of the ``sharpness`` diagnostic, ``server_learning_rate`` is shown in the model card.
#: ``aggregation_weights`` and ``decentralized_participation`` are conventions a preset may set (its paper's choice;
#: see the README's conventions table); unset and not set by the preset, they take these values.
RUN_DEFAULTS: dict[str, Any] = {"rho": 0.05, "server_learning_rate": 1.0, "aggregation_weights": "samples",
                                "decentralized_participation": "sampled"}
#: Trainer fields whose unset value depends on the model and the algorithm (resolve_local_optimizer)
LOCAL_OPTIMIZER_FIELDS = ("optim", "learning_rate")
#: the concept dataclasses composed into FedTrainingArguments; each validates its own fields
CONCEPTS = (PartitionArguments, DiagnosticsArguments, ClientStateArguments, ConcurrencyArguments)


def include_fields(*sources: type | Callable[[], Iterable[dataclasses.Field]], after: str | None = None):
    """Class decorator, applied before ``@dataclass``: adds the fields of ``sources`` to the class.

    A source is a dataclass (its fields, with their types) or a function returning ``dataclasses.Field`` objects
    with their ``name`` and ``type`` set (``hyperparameter_fields``). The fields go right after the class's own
    field ``after`` (default: at the end), in the sources' order; ``--help`` lists them there.
    """

    def decorate(cls: type) -> type:
        added: dict[str, Any] = {}
        for source in sources:
            if dataclasses.is_dataclass(source):
                hints = typing.get_type_hints(source)
                fields = [(f, hints[f.name]) for f in dataclasses.fields(source)]
            else:
                fields = [(f, f.type) for f in source()]
            for f, kind in fields:
                setattr(cls, f.name, dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                       metadata=f.metadata))
                added[f.name] = kind
        own = dict(cls.__dict__.get("__annotations__", {}))
        if after is not None and after not in own:
            raise ValueError(f"include_fields: {cls.__name__} has no field {after!r} to add fields after.")
        annotations: dict[str, Any] = {}
        for name, kind in own.items():
            annotations[name] = kind
            if name == after:
                annotations.update(added)
        annotations.update({} if after is not None else added)
        cls.__annotations__ = annotations
        return cls

    return decorate


def _registered_pieces() -> list[type]:
    """Every registered piece class (perturbations, corrections, aggregators, aggregator plug-ins)."""
    return [*PERTURBATIONS.values(), *CORRECTIONS.values(), *AGGREGATORS.values(), *AGGREGATOR_PLUGINS.values()]


@dataclass
@include_fields(hyperparameter_fields, after="aggregator")
@include_fields(PartitionArguments, after="aggregation_weights")
@include_fields(DiagnosticsArguments, after="batchnorm_buffers")
@include_fields(ClientStateArguments, after="save_every_n_rounds")
@include_fields(ConcurrencyArguments, after="max_consecutive_failed_rounds")
class FedTrainingArguments(TrainingArguments):
    """``TrainingArguments`` plus the federated set-up.

    The Trainer fields (``learning_rate``, ``per_device_train_batch_size``, ``optim``, ``max_grad_norm``,
    ``bf16``, ``gradient_accumulation_steps``, ``report_to``, ``output_dir``, ...) configure each client's
    local training and the run's outputs. Defaults follow the federated papers: a constant lr within a round
    (decayed across rounds by ``lr_decay_per_round``), gradient clipping at norm 10, and, when ``optim`` /
    ``learning_rate`` are left unset, plain SGD at 0.01 for the built-in models, AdamW at the Trainer's 5e-5 (LoRA:
    2e-4) for transformers and timm models (:meth:`apply_model_defaults`).
    Local work per round is ``local_epochs`` or ``local_steps``; ``num_train_epochs``/``max_steps`` are not used.
    The algorithm's hyperparameters are the registered pieces' (inserted after ``aggregator``); the partition,
    diagnostics and client-state fields come from their concepts' dataclasses (see the module docstring).
    """

    # --- algorithm ---------------------------------------------------------------------------------
    fed_algorithm: str = field(
        default="fedavg",
        metadata={"help": "Named algorithm (a preset of perturbation x corrections x aggregator), e.g. fedavg, "
                          "fedsam, scaffold, fedgamma. `hf_fedflat.list_algorithms()` lists them."},
    )
    perturbation: str | None = field(
        default=None, metadata={"help": "Override the preset's perturbation (none, sam, ...)."}
    )
    corrections: str | None = field(
        default=None,
        metadata={"help": "Override the preset's corrections: comma-separated names (e.g. 'scaffold'); '' for none."},
    )
    aggregator: str | None = field(default=None, metadata={"help": "Override the preset's aggregator (mean, ...)."})
    # (every registered piece's hyperparameters go here: include_fields(hyperparameter_fields))

    # --- decentralized (gossip) runs -------------------------------------------------------------------
    decentralized_participation: str | None = field(
        default=None,
        metadata={"help": "Decentralized runs: 'sampled' (only the round's sampled clients train, all gossip) or "
                          "'full' (every client trains every round, as in the seeds' decentralized comparisons). "
                          "Unset: the preset's (dfedavg, dfedavgm, dpsgd, dfedsam, dfedgam: full), else 'sampled'."},
    )
    local_eval_every_n_rounds: int | None = field(
        default=None,
        metadata={"help": "Decentralized runs: evaluate the clients' own models every N rounds (a multiple of "
                          "eval_every_n_rounds; and at the last round). Unset: at every evaluation. The average "
                          "model and the consensus distance are measured as before, whatever N."},
    )
    local_eval_clients: int | None = field(
        default=None,
        metadata={"help": "Decentralized runs: how many clients' own models each such evaluation covers, drawn anew "
                          "each round from (seed, round); 0: none (only the average model). Unset: every client when "
                          "num_clients <= 20, else 10. history.json lists the clients evaluated."},
    )

    # --- federation --------------------------------------------------------------------------------
    num_clients: int = field(default=100, metadata={"help": "Number of clients N the training data is split into."})
    clients_per_round: int | None = field(
        default=None, metadata={"help": "Clients sampled per round. Give this or participation_fraction."}
    )
    participation_fraction: float | None = field(
        default=None,
        metadata={"help": f"Fraction of clients sampled per round, in (0, 1] (default {DEFAULT_PARTICIPATION} "
                          "when clients_per_round is not given either)."},
    )
    num_rounds: int = field(default=100, metadata={"help": "Number of communication rounds."})
    local_epochs: float = field(default=1.0, metadata={"help": "Local epochs per round over the client's data."})
    local_steps: int | None = field(
        default=None, metadata={"help": "Local optimizer steps per round (K); overrides local_epochs when set."}
    )
    lr_decay_per_round: float = field(
        default=1.0, metadata={"help": "Local lr in round t is learning_rate * lr_decay_per_round**t (papers: 0.998)."}
    )
    aggregation_weights: str | None = field(
        default=None,
        metadata={"help": "Aggregation weights p_i: 'samples' (n_i / sum n_j) or 'uniform' (1/m). Unset: the "
                          "preset's paper's choice (the seeds': uniform), else 'samples'."},
    )
    # (the partition goes here: include_fields(PartitionArguments))

    batchnorm_buffers: str = field(
        default="error",
        metadata={"help": "Models with BatchNorm: 'error' refuses them (use GroupNorm, e.g. the resnet18_gn model, "
                          "as the federated papers do); 'average' averages the running statistics across clients "
                          "with the aggregation weights."},
    )
    # (the diagnostics go here: include_fields(DiagnosticsArguments))

    # --- evaluation, checkpoints, client state -------------------------------------------------------
    eval_every_n_rounds: int = field(default=1, metadata={"help": "Evaluate the global model every N rounds (and at the end)."})
    save_every_n_rounds: int = field(
        default=0, metadata={"help": "Write a checkpoint every N rounds under <output_dir>/checkpoints (0: never)."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Start a new run in an output_dir that holds another run's files (checkpoints, final_model, "
                          "history.json, run_status.json): they are deleted before the new run writes. Without it "
                          "such a folder is refused unless resume_from_checkpoint continues that run (the Trainer's "
                          "historical flag, kept with that meaning)."},
    )
    # (the client-state store goes here: include_fields(ClientStateArguments))

    # --- faulty clients ------------------------------------------------------------------------------
    max_update_norm: float | None = field(
        default=None,
        metadata={"help": "Exclude a client whose update ||w_i - w^t|| exceeds this norm (logged with its id); "
                          "NaN/Inf updates and clients whose training raises are always excluded."},
    )
    round_deadline_seconds: float | None = field(
        default=None,
        metadata={"help": "Drop clients not started within this many seconds of the round's start on their "
                          "process, as stragglers (makes results depend on timing)."},
    )
    max_consecutive_failed_rounds: int = field(
        default=3,
        metadata={"help": "Abort when every sampled client raised for this many consecutive rounds (a bug, not bad "
                          "clients); 0 never aborts."},
    )
    divergence_factor: float | None = field(
        default=1000.0,
        metadata={"help": "Fail the run (exit status 3, no final_model/) when a round's train loss is NaN/Inf or above "
                          "divergence_factor x max(1, the initial model's loss on 256 training rows); 0 or None: no "
                          "check."},
    )
    fail_if_not_learned: bool = field(
        default=False,
        metadata={"help": "Exit with status 3 (final_model/ kept) when the final model did not learn: its eval accuracy "
                          "at the chance level (the majority class's share of the training rows) or its eval loss not "
                          "below the initial model's. Either way the log, run_status.json and the card say so."},
    )

    # (clients trained at once go here: include_fields(ConcurrencyArguments))

    # --- Trainer defaults changed to the federated papers' (optim, learning_rate: by model) -------------
    learning_rate: float | None = field(
        default=None,
        metadata={"help": "Local (client) learning rate eta in round 0. Unset: 0.01 with SGD (the papers'); with "
                          "another optimizer, 5e-5 for a transformers or timm model (the Trainer's; with LoRA 2e-4), "
                          "0.01 for the built-in models."},
    )
    optim: str | None = field(
        default=None,
        metadata={"help": "Local optimizer (a Trainer optim name). Unset: adamw_torch for a transformers model "
                          "(--model_name_or_path) or a timm model given by name, sgd for the built-in models "
                          "(small_cnn, fedgam_cnn, resnet18_gn, logistic, the LSTMs), as in the papers. Algorithms "
                          "whose formulas assume plain SGD keep sgd for every model and refuse (or warn about) "
                          "another optimizer: " + ", ".join(plain_sgd_presets()) + "."},
    )
    lr_scheduler_type: str = field(
        default="constant", metadata={"help": "Schedule within a client's local training (papers: constant)."}
    )
    max_grad_norm: float = field(default=10.0, metadata={"help": "Clip the final step direction to this norm (papers: 10)."})
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Local batch size."})
    per_device_eval_batch_size: int = field(default=128, metadata={"help": "Batch size when evaluating the global model."})
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Keep False for datasets with on-the-fly transforms (with_transform)."}
    )

    def __post_init__(self):
        # optim / learning_rate left unset (None) take the built-in models' defaults now, and the model's once it is
        # known (apply_model_defaults); the ones given always win
        self._unset_optimizer_fields = tuple(name for name in LOCAL_OPTIMIZER_FIELDS if getattr(self, name) is None)
        self._optimizer_context: tuple[bool, bool] = (False, False)  # (trainer conventions, LoRA)
        self.optim, self.learning_rate, self.optimizer_defaults_note, _ = self._local_optimizer(pieces=())
        check_trainer_fields(self)  # strings converted, unused Trainer fields refused, inherited fields checked
        self._validate_federated_fields()
        # The parent sets up accelerate: inside a multi-process launch, hf_fedflat.init_process_group() must have
        # turned it into N single-process trainers first (it hides the launcher's WORLD_SIZE; see
        # hf_fedflat.federation.comm for why).
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size > 1:
            raise RuntimeError(
                f"FedTrainingArguments: this process is one of {world_size} launched processes, but the federated "
                "process group was not opened: call hf_fedflat.init_process_group() first thing in the script, "
                "before building FedTrainingArguments or any TrainingArguments."
            )
        super().__post_init__()

    # ------------------------------------------------------------------------------------------------
    def _local_optimizer(self, pieces):
        """``(optim, learning_rate, note)`` with the unset ones filled in for the model context and ``pieces``."""
        unset = self._unset_optimizer_fields
        trainer_conventions, use_lora = self._optimizer_context
        return resolve_local_optimizer(None if "optim" in unset else self.optim,
                                       None if "learning_rate" in unset else self.learning_rate,
                                       trainer_conventions=trainer_conventions, use_lora=use_lora,
                                       pieces=pieces)

    def apply_model_defaults(self, trainer_conventions: bool, use_lora: bool = False) -> None:
        """Fill ``optim`` and ``learning_rate``, where the user left them unset, for the model: AdamW at the
        Trainer's rate for a transformers or timm model (``trainer_conventions``; ``use_lora``: LoRA's rate), the
        papers' SGD for the built-in models and for algorithms that assume plain SGD
        (:func:`hf_fedflat.algorithms.optimizers.resolve_local_optimizer`). ``build_experiment`` calls it with
        ``ModelArguments.follows_trainer_conventions``; values given are never changed."""
        from transformers.training_args import OptimizerNames

        self._optimizer_context = (bool(trainer_conventions), bool(use_lora))
        self._model_defaults_applied = True
        optim, self.learning_rate, self.optimizer_defaults_note, kept_sgd_for = self._local_optimizer(
            self.active_pieces())
        self.optim = OptimizerNames(optim)
        if kept_sgd_for:
            logger.warning("optim: left unset, it is sgd at learning_rate %g for %s, not the AdamW of transformers "
                           "models: %s assumes plain SGD on the clients (see --help, --optim). Set --learning_rate "
                           "for SGD on this model, or pick an algorithm that works with AdamW (fedavg, fedprox, "
                           "fedsam, ...).", self.learning_rate, self.algorithm_label, ", ".join(kept_sgd_for))

    @property
    def model_defaults_applied(self) -> bool:
        """Whether :meth:`apply_model_defaults` has run (the CLI calls it; a trainer built in Python, from its model)."""
        return self._optimizer_context != (False, False) or getattr(self, "_model_defaults_applied", False)

    @property
    def unset_optimizer_fields(self) -> tuple[str, ...]:
        """``optim`` / ``learning_rate`` when the user did not give them (filled in by the defaults)."""
        return self._unset_optimizer_fields

    @property
    def num_clients_per_round(self) -> int:
        if self.clients_per_round is not None:
            return self.clients_per_round
        fraction = self.participation_fraction if self.participation_fraction is not None else DEFAULT_PARTICIPATION
        return max(1, int(round(fraction * self.num_clients)))

    def with_algorithm(self, fed_algorithm: str, **changes) -> "FedTrainingArguments":
        """A copy for another algorithm: fields this run took from its preset's or its pieces' defaults (``rho``,
        ``server_learning_rate``, ...) go back to unset, so the new preset and pieces apply their own."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        values.update({name: None for name in getattr(self, "_defaulted_fields", ())})
        values.update({name: None for name in self._unset_optimizer_fields})  # the new algorithm's defaults
        values.update(fed_algorithm=fed_algorithm, **changes)
        copy = type(self)(**values)
        copy.restrict_explicit_fields([*getattr(self, "_explicit_fields", ()), *changes])
        copy._given_fields = tuple(sorted({*self.given_fields, *changes}))
        if self._optimizer_context != (False, False):
            copy.apply_model_defaults(*self._optimizer_context)
        return copy

    def restrict_explicit_fields(self, names) -> None:
        """Count only ``names`` as the hyperparameters the user gave (:meth:`check_algorithm_settings` refuses or warns
        about those): the parser passes the flags and config keys given, so a recipe's defaults are not counted."""
        names = set(names)
        self._explicit_fields = tuple(n for n in getattr(self, "_explicit_fields", ()) if n in names)
        self._given_fields = tuple(sorted(names))

    @property
    def given_fields(self) -> tuple[str, ...]:
        """The fields the user gave as flags or config keys (empty for arguments built in Python, where every value
        counts as chosen): a default that depends on the data (the partition of a causal LM's rows) applies only to
        the others."""
        return getattr(self, "_given_fields", ())

    @property
    def diagnostics_list(self) -> list[str]:
        """The opt-in diagnostics as a list (the field is a comma-separated string for the CLI)."""
        return parse_diagnostics(self.diagnostics)

    @property
    def effective_partition_seed(self) -> int:
        return self.seed if self.partition_seed is None else self.partition_seed

    def active_pieces(self) -> list[type]:
        """The classes of this run's pieces: perturbation, corrections in order, aggregator, its plug-ins."""
        perturbation, corrections, aggregator = resolve_parts(
            self.fed_algorithm, self.perturbation, self.corrections, self.aggregator)
        base, plugins = split_plugins(aggregator)
        return [PERTURBATIONS[perturbation], *(CORRECTIONS[name] for name in corrections), AGGREGATORS[base],
                *(AGGREGATOR_PLUGINS[name] for name in plugins)]

    def algorithm_hyperparameters(self) -> dict[str, Any]:
        """``{field: value}`` of every hyperparameter this run's pieces read, in piece order (perturbation,
        corrections, aggregator): what must match for a checkpoint to resume, and what the model card lists."""
        names = [f.name for piece in self.active_pieces() for f in dataclasses.fields(piece.config_class)]
        return {name: getattr(self, name) for name in dict.fromkeys(names)}

    # ------------------------------------------------------------------------------------------------
    @property
    def algorithm_label(self) -> str:
        """What runs, by name: the preset's, with the parts given in its place (``dfedsam (perturbation=gam)``)."""
        from .algorithms.conflicts import algorithm_label

        return algorithm_label(self.fed_algorithm, self.perturbation, self.corrections, self.aggregator)

    def check_algorithm_settings(self) -> None:
        """Refuse (``ConfigError``, a ``ValueError`` naming the fields) the settings that contradict the algorithm: an
        aggregator of the other kind than the preset's (server / decentralized), gossip flags on a server run, ...;
        warn once about hyperparameters given that no piece of the run reads. Every run does this before it
        starts (``build_algorithm``; the CLI and the recipes before any data loads): see
        :mod:`hf_fedflat.algorithms.conflicts`."""
        from .algorithms.conflicts import check_algorithm_settings

        also_read = ("rho",) if "sharpness" in self.diagnostics_list else ()  # the sharpness diagnostic's radius
        check_algorithm_settings(self, getattr(self, "_explicit_fields", ()), also_read)

    def _resolve_hyperparameters(self, pieces: list[type]) -> None:
        """Unset (None) hyperparameters take the preset's default, then the active pieces' own, then
        :data:`RUN_DEFAULTS`; the ones filled in are recorded in ``_defaulted_fields`` (see :meth:`with_algorithm`),
        the ones given (not None before) in ``_explicit_fields`` (see :meth:`check_algorithm_settings`).
        A hyperparameter that no active piece reads stays unset."""
        given = [f.name for piece in _registered_pieces() for f in dataclasses.fields(piece.config_class)]
        given += list(DECENTRALIZED_RUN_FIELDS)
        self._explicit_fields = tuple(sorted(name for name in set(given) if getattr(self, name, None) is not None))
        defaulted = set()
        sources = [dict(get_preset(self.fed_algorithm).defaults), *(p.config_class.defaults() for p in pieces), RUN_DEFAULTS]
        for source in sources:
            for name, value in source.items():
                if hasattr(self, name) and getattr(self, name) is None:
                    setattr(self, name, value)
                    defaulted.add(name)
        self._defaulted_fields = tuple(sorted(defaulted))

    def _validate_federated_fields(self) -> None:
        pieces = self.active_pieces()  # unknown names fail here (fed_algorithm, perturbation, ...)
        self._resolve_hyperparameters(pieces)

        for name in ("num_clients", "num_rounds", "eval_every_n_rounds"):
            check_integer(name, getattr(self, name))
        # every piece checks its own hyperparameters (unset ones at its default), used by this run or not
        for piece in _registered_pieces():
            piece.config_class.from_args(self).validate()
        for concept in CONCEPTS:
            concept(**{f.name: getattr(self, f.name) for f in dataclasses.fields(concept)}).validate()

        if self.max_update_norm is not None:
            check_number("max_update_norm", self.max_update_norm, low=0.0, low_open=True)
        if self.round_deadline_seconds is not None:
            check_number("round_deadline_seconds", self.round_deadline_seconds, low=0.0, low_open=True)
        check_integer("max_consecutive_failed_rounds", self.max_consecutive_failed_rounds, low=0)
        if self.divergence_factor is not None and self.divergence_factor != 0:
            check_number("divergence_factor", self.divergence_factor, low=1.0)
        if not isinstance(self.fail_if_not_learned, bool):
            fail("fail_if_not_learned", f"must be true or false, got {self.fail_if_not_learned!r}.")
        if not isinstance(self.overwrite_output_dir, bool):
            fail("overwrite_output_dir", f"must be true or false, got {self.overwrite_output_dir!r}.")
        check_choice("decentralized_participation", self.decentralized_participation, DECENTRALIZED_PARTICIPATION)
        if self.local_eval_every_n_rounds is not None:
            check_integer("local_eval_every_n_rounds", self.local_eval_every_n_rounds)
            if self.local_eval_every_n_rounds % self.eval_every_n_rounds:
                fail("local_eval_every_n_rounds", f"must be a multiple of eval_every_n_rounds="
                     f"{self.eval_every_n_rounds} (the local models are evaluated on evaluation rounds), got "
                     f"{self.local_eval_every_n_rounds}.")
        if self.local_eval_clients is not None:
            check_integer("local_eval_clients", self.local_eval_clients, low=0)
        check_number("lr_decay_per_round", self.lr_decay_per_round, low=0.0, high=1.0, low_open=True)
        check_number("local_epochs", self.local_epochs, low=0.0, low_open=True)
        if self.local_steps is not None:
            check_integer("local_steps", self.local_steps)
        if not isinstance(self.save_every_n_rounds, int) or self.save_every_n_rounds < 0:
            fail("save_every_n_rounds",
                 f"must be an integer >= 0 (0: no periodic checkpoints), got {self.save_every_n_rounds!r}.")
        if self.clients_per_round is not None and self.participation_fraction is not None:
            fail("clients_per_round", "give either clients_per_round or participation_fraction, not both.")
        if self.clients_per_round is not None:
            check_integer("clients_per_round", self.clients_per_round)
            if self.clients_per_round > self.num_clients:
                fail("clients_per_round", f"{self.clients_per_round} is more than num_clients={self.num_clients}; "
                     "lower it or raise num_clients.")
        if self.participation_fraction is not None:
            check_number("participation_fraction", self.participation_fraction, low=0.0, high=1.0, low_open=True)
        check_choice("aggregation_weights", self.aggregation_weights, AGGREGATION_WEIGHTS)
        check_choice("batchnorm_buffers", self.batchnorm_buffers, BATCHNORM_BUFFERS)
        if self.save_every_n_rounds and self.save_every_n_rounds > self.num_rounds:
            fail("save_every_n_rounds", f"{self.save_every_n_rounds} exceeds num_rounds={self.num_rounds}; no "
                 "checkpoint would be written.")

        # across concepts: what the built pieces need
        needed = max(getattr(piece, "min_clients_per_round", 1) for piece in pieces)
        if self.num_clients_per_round < needed:
            fail("clients_per_round", f"this algorithm ({self.fed_algorithm}, aggregator {self.aggregator_name}) needs "
                 f"at least {needed} clients per round, got {self.num_clients_per_round}; raise clients_per_round "
                 "(or participation_fraction) or pick another aggregator.")
        if "perturbation_drift" in self.diagnostics_list and not issubclass(pieces[0], SharpnessAware):
            fail("diagnostics", f"perturbation_drift measures a SAM-type perturbation; this algorithm has none "
                 f"(perturbation={pieces[0].name!r}). Drop it from diagnostics or pick a perturbation (sam, lesam, ...).")
        if self.topology == "graph" and self.topology_edges:
            self._check_graph_connected()
        from .algorithms.optimizers import check_optimizer_compatibility  # pieces that assume plain SGD

        check_optimizer_compatibility(pieces, self.optim, self.optim_args)
        from .privacy import settle_privacy  # a noised release (+dp): delta filled in, sigma calibrated to the budget

        settle_privacy(self)

    def _check_graph_connected(self) -> None:
        """A gossip graph in several pieces (spectral gap 0) never reaches consensus: refuse it now."""
        from .algorithms.topology import _connected, _undirected_edges, load_edges

        edges = _undirected_edges(self.num_clients, load_edges(self.topology_edges))
        if not _connected(self.num_clients, edges):
            fail("topology_edges", f"the graph in {self.topology_edges} does not connect all {self.num_clients} "
                 "clients (spectral gap 0): clients in different pieces never reach consensus. Add edges between "
                 "the pieces, or list every client 0..num_clients-1 in some edge.")

    @property
    def aggregator_name(self) -> str:
        """The aggregator this run uses, with its plug-ins (``mean+fedgh``)."""
        return resolve_parts(self.fed_algorithm, self.perturbation, self.corrections, self.aggregator)[2]
