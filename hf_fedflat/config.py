"""``FedTrainingArguments``: every setting of a federated run, validated before anything loads."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from transformers import TrainingArguments

AGGREGATION_WEIGHTS = ("samples", "uniform")
PARTITION_SCHEMES = ("iid", "dirichlet", "inner_dirichlet", "pathological")
LESAM_DIRECTIONS = ("per_client", "last_global_update")
DIAGNOSTICS = ("train_accuracy", "client_accuracy", "sharpness", "perturbation_drift", "gradient_conflict", "loss_surface")
TOPOLOGIES = ("ring", "full", "exponential", "random_regular", "random_k_out", "graph")
DECENTRALIZED_PARTICIPATION = ("full", "sampled")
CLIENT_STATE_STORES = ("auto", "memory", "disk")
BATCHNORM_BUFFERS = ("error", "average")
#: rho when neither the user nor the preset sets one
DEFAULT_RHO = 0.05
DEFAULT_PARTICIPATION = 0.1


def _fail(field_name: str, message: str) -> None:
    raise ValueError(f"{field_name}: {message}")


@dataclass
class FedTrainingArguments(TrainingArguments):
    """``TrainingArguments`` plus the federated set-up.

    The Trainer fields (``learning_rate``, ``per_device_train_batch_size``, ``optim``, ``max_grad_norm``,
    ``bf16``, ``gradient_accumulation_steps``, ``report_to``, ``output_dir``, ...) configure each client's
    local training and the run's outputs. Defaults follow the federated papers: plain SGD at a constant
    lr within a round (decayed across rounds by ``lr_decay_per_round``), gradient clipping at norm 10.
    Local work per round is ``local_epochs`` or ``local_steps``; ``num_train_epochs``/``max_steps`` are not used.
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
    rho: float | None = field(
        default=None,
        metadata={"help": "Perturbation radius of SAM-type steps (sam, gam, gam_original, lesam, smoo). Unset: the "
                          "preset's default, else the perturbation's (sam/lesam/smoo 0.05, gam 0.02, gam_original 0.2)."},
    )
    gam_alpha: float = field(
        default=0.2, metadata={"help": "GAM (FedGAM form): weight alpha in d = g + alpha*rho*grad F(w + rho*g/||g||) (paper: 0.2)."}
    )
    gam_rho_prime: float = field(
        default=0.03, metadata={"help": "Original GAM: radius rho' of the inner gradient-norm perturbation (0.03)."}
    )
    gam_grad_alpha: float = field(
        default=0.1, metadata={"help": "Original GAM: alpha mixing g1 and g3 in h+ = alpha*g1 + (1-alpha)*g3 (0.1)."}
    )
    gam_grad_beta: float = field(
        default=0.1, metadata={"help": "Original GAM: beta mixing g0 and g2 in h- = beta*g0 + (1-beta)*g2 (0.1)."}
    )
    gam_gamma: float = field(
        default=0.05, metadata={"help": "Original GAM: weight gamma of the projected h- term (0.05)."}
    )
    lesam_direction: str = field(
        default="per_client",
        metadata={"help": "LESAM's estimate of the global perturbation: 'per_client' (paper: w_old_i - w^t with w_old_i "
                          "the global model the client received when it last took part) or 'last_global_update' "
                          "(public code: w^{t-1} - w^t for everyone)."},
    )
    scaffold_lambda: float = field(
        default=1.0, metadata={"help": "Scale of the SCAFFOLD correction lambda_c*(c - c_i) (1 in the paper)."}
    )
    prox_mu: float = field(default=0.01, metadata={"help": "FedProx: weight mu of the proximal term mu*(w - w^t)."})
    feddyn_alpha: float = field(
        default=0.1, metadata={"help": "FedDyn / FedSMOO / FedLESAM-D: weight alpha of the dynamic regulariser."}
    )
    fedup_alpha: float = field(
        default=0.01,
        metadata={"help": "FedUp: alpha in (alpha/eta)(w^{t-1} - w^t) + alpha*(w - w^t), the upper-bound terms."},
    )
    momentum_alpha: float = field(
        default=0.1,
        metadata={"help": "MoFedSAM: d <- a*d + (1-a)*m with m the last global update per local step; a (0.1)."},
    )
    server_beta1: float = field(default=0.9, metadata={"help": "FedAdam: server first-moment decay b1 (0.9)."})
    server_beta2: float = field(default=0.99, metadata={"help": "FedAdam: server second-moment decay b2 (0.99)."})
    server_tau: float = field(default=1e-2, metadata={"help": "FedAdam: adaptivity tau in m/(sqrt(v)+tau) (1e-2)."})

    # --- decentralized (gossip) runs -------------------------------------------------------------------
    topology: str = field(
        default="random_regular",
        metadata={"help": "Decentralized runs: communication graph (ring, full, exponential, random_regular, "
                          "random_k_out, graph)."},
    )
    topology_degree: int = field(
        default=10, metadata={"help": "Neighbours per client of random_regular / random_k_out (seed: at most 10)."}
    )
    topology_redraw: bool = field(
        default=False, metadata={"help": "Draw a new random topology every round (random_regular / random_k_out)."}
    )
    topology_edges: str | None = field(
        default=None,
        metadata={"help": "topology=graph: path to a JSON list of undirected edges [[i, j], ...]; "
                          "Metropolis-Hastings weights."},
    )
    gossip_steps: int = field(default=1, metadata={"help": "Gossip steps Q per round (mixing with W^Q)."})
    decentralized_participation: str = field(
        default="sampled",
        metadata={"help": "Decentralized runs: 'sampled' (seed: only the round's sampled clients train, all gossip) "
                          "or 'full' (every client trains every round)."},
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
    server_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Server learning rate eta_g: w <- w + eta_g * sum_i p_i (w_i - w). Unset: the preset's "
                          "(fedadam 0.1), else 1."},
    )
    lr_decay_per_round: float = field(
        default=1.0, metadata={"help": "Local lr in round t is learning_rate * lr_decay_per_round**t (papers: 0.998)."}
    )
    aggregation_weights: str = field(
        default="samples",
        metadata={"help": "Aggregation weights p_i: 'samples' (n_i / sum n_j) or 'uniform' (1/m)."},
    )

    # --- data partition ----------------------------------------------------------------------------
    partition_scheme: str = field(
        default="dirichlet",
        metadata={"help": "How the training data is split: iid, dirichlet (per class over clients), "
                          "inner_dirichlet (equal sizes, per client over classes), pathological (k classes each)."},
    )
    dirichlet_alpha: float = field(
        default=0.3, metadata={"help": "Concentration of the Dirichlet partitions (smaller = more heterogeneous)."}
    )
    classes_per_client: int = field(default=2, metadata={"help": "Classes per client of the pathological partition."})
    min_partition_size: int = field(default=2, metadata={"help": "Smallest client dataset a Dirichlet partition may produce."})
    partition_seed: int | None = field(default=None, metadata={"help": "Seed of the partition (default: seed)."})

    batchnorm_buffers: str = field(
        default="error",
        metadata={"help": "Models with BatchNorm: 'error' refuses them (use GroupNorm, e.g. the resnet18_gn model, "
                          "as the federated papers do); 'average' averages the running statistics across clients "
                          "with the aggregation weights."},
    )

    # --- evaluation, diagnostics, checkpoints, client state -----------------------------------------
    diagnostics: str = field(
        default="",
        metadata={"help": "Comma-separated opt-in measurements logged to history.json: "
                          f"{', '.join(DIAGNOSTICS)}. Bytes per round and time to target_accuracy are always logged."},
    )
    diagnostics_num_samples: int = field(
        default=1024,
        metadata={"help": "Training samples used by train_accuracy / sharpness / loss_surface (a fixed random subset)."},
    )
    loss_surface_resolution: int = field(
        default=11, metadata={"help": "loss_surface: grid points per axis over [-1, 1] x [-1, 1]."}
    )
    target_accuracy: float | None = field(
        default=None, metadata={"help": "Log the round and wall time at which eval accuracy first reaches this value."}
    )
    eval_every_n_rounds: int = field(default=1, metadata={"help": "Evaluate the global model every N rounds (and at the end)."})
    save_every_n_rounds: int = field(
        default=0, metadata={"help": "Write a checkpoint every N rounds under <output_dir>/checkpoints (0: never)."}
    )
    client_state_store: str = field(
        default="auto",
        metadata={"help": "Where per-client state (SCAFFOLD's c_i, ...) lives: memory, disk (one safetensors file "
                          "per client), or auto (memory until client_state_memory_mb is exceeded, then disk)."},
    )
    client_state_dir: str | None = field(
        default=None, metadata={"help": "Folder of the disk client-state store (default <output_dir>/client_states)."}
    )
    client_state_memory_mb: float = field(
        default=256.0,
        metadata={"help": "Memory budget of the 'auto' client-state store: states stay in memory up to it, every "
                          "further client's state goes to its own file on disk."},
    )

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

    # --- Trainer defaults changed to the federated papers' ---------------------------------------------
    learning_rate: float = field(default=0.01, metadata={"help": "Local (client) learning rate eta in round 0."})
    optim: str = field(default="sgd", metadata={"help": "Local optimizer (papers: plain SGD)."})
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
    @property
    def num_clients_per_round(self) -> int:
        if self.clients_per_round is not None:
            return self.clients_per_round
        fraction = self.participation_fraction if self.participation_fraction is not None else DEFAULT_PARTICIPATION
        return max(1, int(round(fraction * self.num_clients)))

    def with_algorithm(self, fed_algorithm: str, **changes) -> "FedTrainingArguments":
        """A copy for another algorithm: fields this run took from its preset's defaults (``rho``,
        ``server_learning_rate``, ...) go back to unset, so the new preset applies its own."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        values.update({name: None for name in getattr(self, "_defaulted_fields", ())})
        values.update(fed_algorithm=fed_algorithm, **changes)
        return type(self)(**values)

    @property
    def diagnostics_list(self) -> list[str]:
        """The opt-in diagnostics as a list (the field is a comma-separated string for the CLI)."""
        return [d.strip() for d in (self.diagnostics or "").split(",") if d.strip()]

    @property
    def effective_partition_seed(self) -> int:
        return self.seed if self.partition_seed is None else self.partition_seed

    def _validate_federated_fields(self) -> None:
        from .algorithms import get_preset, resolve_parts

        from .algorithms import PERTURBATIONS

        perturbation, _, _ = resolve_parts(self.fed_algorithm, self.perturbation, self.corrections, self.aggregator)
        # Unset (None) fields take the preset's default, then the piece's own, then the global one.
        unset = {name for name in ("rho", "server_learning_rate") if getattr(self, name) is None}
        defaulted = set()
        for name, value in get_preset(self.fed_algorithm).defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
                defaulted.add(name)
        if self.rho is None:
            self.rho = float(getattr(PERTURBATIONS[perturbation], "default_rho", DEFAULT_RHO))
        if self.server_learning_rate is None:
            self.server_learning_rate = 1.0
        self._defaulted_fields = tuple(sorted(defaulted | {n for n in ("rho", "server_learning_rate") if n in unset}))

        def positive_int(name):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                _fail(name, f"must be an integer >= 1, got {value!r}.")

        def finite(name, low=None, high=None, low_open=False):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                _fail(name, f"must be a finite number, got {value!r}.")
            if low is not None and (value <= low if low_open else value < low):
                _fail(name, f"must be {'>' if low_open else '>='} {low}, got {value}.")
            if high is not None and value > high:
                _fail(name, f"must be <= {high}, got {value}.")

        for name in ("num_clients", "num_rounds", "eval_every_n_rounds", "min_partition_size", "classes_per_client"):
            positive_int(name)
        finite("rho", low=0.0)
        finite("scaffold_lambda")
        for name in ("gam_alpha", "gam_rho_prime", "prox_mu", "feddyn_alpha", "fedup_alpha", "server_tau"):
            finite(name, low=0.0)
        for name in ("gam_grad_alpha", "gam_grad_beta", "gam_gamma", "momentum_alpha"):
            finite(name, low=0.0, high=1.0)
        for name in ("server_beta1", "server_beta2"):
            finite(name, low=0.0)
            if getattr(self, name) >= 1:
                _fail(name, f"must be in [0, 1), got {getattr(self, name)}.")
        if self.lesam_direction not in LESAM_DIRECTIONS:
            _fail("lesam_direction", f"must be one of {LESAM_DIRECTIONS}, got {self.lesam_direction!r}.")
        unknown = [d for d in self.diagnostics_list if d not in DIAGNOSTICS]
        if unknown:
            _fail("diagnostics", f"unknown {unknown}; choose from {', '.join(DIAGNOSTICS)} (comma-separated).")
        positive_int("diagnostics_num_samples")
        if not isinstance(self.loss_surface_resolution, int) or self.loss_surface_resolution < 2:
            _fail("loss_surface_resolution", f"must be an integer >= 2, got {self.loss_surface_resolution!r}.")
        if self.target_accuracy is not None:
            finite("target_accuracy", low=0.0, high=1.0)
        if self.max_update_norm is not None:
            finite("max_update_norm", low=0.0, low_open=True)
        if self.round_deadline_seconds is not None:
            finite("round_deadline_seconds", low=0.0, low_open=True)
        if not isinstance(self.max_consecutive_failed_rounds, int) or self.max_consecutive_failed_rounds < 0:
            _fail("max_consecutive_failed_rounds", f"must be an integer >= 0, got {self.max_consecutive_failed_rounds!r}.")
        if self.topology not in TOPOLOGIES:
            _fail("topology", f"must be one of {TOPOLOGIES}, got {self.topology!r}.")
        positive_int("topology_degree")
        positive_int("gossip_steps")
        if self.topology == "graph" and not self.topology_edges:
            _fail("topology_edges", "topology='graph' needs a JSON file of undirected edges [[i, j], ...].")
        if self.decentralized_participation not in DECENTRALIZED_PARTICIPATION:
            _fail("decentralized_participation",
                  f"must be one of {DECENTRALIZED_PARTICIPATION}, got {self.decentralized_participation!r}.")
        finite("server_learning_rate", low=0.0, low_open=True)
        finite("lr_decay_per_round", low=0.0, high=1.0, low_open=True)
        finite("dirichlet_alpha", low=0.0, low_open=True)
        finite("local_epochs", low=0.0, low_open=True)
        finite("learning_rate", low=0.0, low_open=True)
        finite("client_state_memory_mb", low=0.0)
        if self.local_steps is not None:
            positive_int("local_steps")
        if not isinstance(self.save_every_n_rounds, int) or self.save_every_n_rounds < 0:
            _fail("save_every_n_rounds", f"must be an integer >= 0 (0: no periodic checkpoints), got {self.save_every_n_rounds!r}.")
        if self.clients_per_round is not None and self.participation_fraction is not None:
            _fail("clients_per_round", "give either clients_per_round or participation_fraction, not both.")
        if self.clients_per_round is not None:
            positive_int("clients_per_round")
            if self.clients_per_round > self.num_clients:
                _fail("clients_per_round", f"{self.clients_per_round} is more than num_clients={self.num_clients}; "
                      "lower it or raise num_clients.")
        if self.participation_fraction is not None:
            finite("participation_fraction", low=0.0, high=1.0, low_open=True)
        if self.aggregation_weights not in AGGREGATION_WEIGHTS:
            _fail("aggregation_weights", f"must be one of {AGGREGATION_WEIGHTS}, got {self.aggregation_weights!r}.")
        if self.partition_scheme not in PARTITION_SCHEMES:
            _fail("partition_scheme", f"must be one of {PARTITION_SCHEMES}, got {self.partition_scheme!r}.")
        if self.batchnorm_buffers not in BATCHNORM_BUFFERS:
            _fail("batchnorm_buffers", f"must be one of {BATCHNORM_BUFFERS}, got {self.batchnorm_buffers!r}.")
        if self.client_state_store not in CLIENT_STATE_STORES:
            _fail("client_state_store", f"must be one of {CLIENT_STATE_STORES}, got {self.client_state_store!r}.")
        if self.max_steps is not None and self.max_steps > 0:
            _fail("max_steps", "is not used by federated training; set local_steps (steps per client per round) "
                  "and num_rounds instead.")
        if self.save_every_n_rounds and self.save_every_n_rounds > self.num_rounds:
            _fail("save_every_n_rounds", f"{self.save_every_n_rounds} exceeds num_rounds={self.num_rounds}; no checkpoint "
                  "would be written.")
        _, _, aggregator = resolve_parts(self.fed_algorithm, self.perturbation, self.corrections, self.aggregator)
        if "+fedgh" in aggregator and self.num_clients_per_round < 2:
            _fail("clients_per_round", f"FedGH ({aggregator}) harmonizes pairs of client updates and needs at least 2 "
                  f"clients per round, got {self.num_clients_per_round}; raise clients_per_round or drop '+fedgh'.")
        if "perturbation_drift" in self.diagnostics_list and perturbation == "none":
            _fail("diagnostics", "perturbation_drift measures a SAM-type perturbation; this algorithm has none "
                  "(perturbation='none'). Drop it from diagnostics or pick a perturbation (sam, lesam, ...).")
