"""``DecentralizedTrainer``: the federated trainer with :class:`~.gossip_strategy.GossipStrategy` as its round
strategy.

Every client keeps its own model; a round ends with gossip, not a server step (see
:mod:`hf_fedflat.decentralized.gossip_strategy`). The loop, client training, failure policy, checkpoints and
callbacks are the federated trainer's, unchanged. Which of the two trainers a run needs is
:func:`hf_fedflat.federation.trainer_factory.trainer_class_for`.
"""

from __future__ import annotations

import torch

from ..algorithms import AGGREGATORS, resolve_parts
from ..algorithms.registry import split_plugins
from ..config import FedTrainingArguments
from ..federation.trainer import FederatedTrainer
from ..aggregators.gossip import is_decentralized
from .gossip_strategy import GossipStrategy


class DecentralizedTrainer(FederatedTrainer):
    """Runs a decentralized experiment (no server) with any algorithm whose aggregator is decentralized.

    Same constructor and :meth:`train` as :class:`~hf_fedflat.FederatedTrainer`, plus:

    Args:
        local_eval_models: how many local models to evaluate on a local-evaluation round (their metrics' mean
            and std go to ``history.json``); overrides ``args.local_eval_clients``. Default: all of them when
            ``num_clients <= 20``, else 10, drawn anew each round from ``(seed, round)``; 0 evaluates only the
            average model. Which rounds: ``args.local_eval_every_n_rounds`` (default: every evaluation).

    ``history.json`` records carry the keys of the federated loop (``eval_accuracy``/``eval_loss`` are
    those of the average model ``x_bar = mean_i x_i``; ``clients`` are the clients that trained) plus
    ``consensus_distance`` (``mean_i ||x_i - x_bar||`` after gossip), ``spectral_gap`` (of the round's ``W``),
    ``bytes_gossip`` (models sent between neighbours) and, on local-evaluation rounds, ``local_eval_<metric>_mean`` /
    ``_std`` over the evaluated local models and ``local_eval_clients`` (which ones). A client whose training fails (see ``max_update_norm``,
    ``round_deadline_seconds``) is listed in ``failed_clients`` and gossips its model unchanged. The final
    model saved and returned is ``x_bar``.
    """

    supports_decentralized = True

    def __init__(self, model: torch.nn.Module, args: FedTrainingArguments, train_dataset, eval_dataset=None, *,
                 local_eval_models: int | None = None, **kwargs):
        super().__init__(model, args, train_dataset, eval_dataset, **kwargs)
        aggregator, plugins = aggregator_parts(args)
        if not is_decentralized(AGGREGATORS[aggregator]):
            raise ValueError(
                f"aggregator: {aggregator!r} updates a global model on a server; DecentralizedTrainer needs a "
                "decentralized aggregator such as 'gossip' (fed_algorithm dfedavg, dfedavgm, dpsgd, dfedsam, dfedgam). "
                "Use FederatedTrainer, or hf_fedflat.create_trainer to pick the trainer from the arguments."
            )
        if plugins:
            raise ValueError(
                f"aggregator: the plug-ins {', '.join('+' + p for p in plugins)} transform the updates a server "
                f"aggregates and do not apply to {aggregator!r}; drop them from fed_algorithm/aggregator."
            )
        params = self.space.flatten().cpu()
        with_server_half = [piece for piece in self.algorithm.client_pieces if piece.init_server_state(params)]
        if with_server_half:
            field = "perturbation" if self.algorithm.perturbation in with_server_half else "corrections"
            raise ValueError(
                f"{field}: {', '.join(p.name for p in with_server_half)} needs server-side state, and a decentralized "
                "run has no server. Choose pieces without a server half (e.g. perturbation none/sam/gam, correction "
                "prox) or a centralized aggregator."
            )
        self.strategy = GossipStrategy(self.algorithm, args, self.store, local_eval_models)

    # -- the clients' own models (main process) --------------------------------------------------------
    def local_eval_clients(self, round_index: int) -> list[int]:
        """The clients whose own models are evaluated at round ``round_index`` (0-based; [] on other rounds)."""
        return self.strategy.local_eval_clients(round_index)

    def local_model(self, client_id: int) -> dict[str, torch.Tensor]:
        """Client ``client_id``'s own model ``{"params": x_i[, "buffers": ...]}`` (main process only)."""
        return self.strategy.local_model(client_id)

    def average_model(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``x_bar`` in the models' dtypes, and in float64 (one pass over the store)."""
        return self.strategy.average_model()

    def consensus_distance(self, average: dict[str, torch.Tensor] | None = None) -> float:
        """``mean_i ||x_i - x_bar||`` over the trainable parameters (float64; main process only)."""
        return self.strategy.consensus_distance(average)

    def evaluate_local_models(self, client_ids: list[int] | None = None) -> dict:
        """Mean and std (over clients) of every eval metric of the clients' own models, and which clients."""
        return self.strategy.evaluate_local_models(self.evaluate, client_ids)


def aggregator_parts(args) -> tuple[str, tuple[str, ...]]:
    """The run's aggregator name and its plug-ins (``"mean+fedgh"`` -> ``("mean", ("fedgh",))``)."""
    _, _, aggregator = resolve_parts(args.fed_algorithm, args.perturbation, args.corrections, args.aggregator)
    return split_plugins(aggregator)
