"""The trainer a run needs, picked from its arguments: every entry point builds its trainer here.

A server aggregator gets :class:`~hf_fedflat.federation.trainer.FederatedTrainer`, a decentralized one (gossip)
:class:`~hf_fedflat.decentralized.DecentralizedTrainer`; the choice reads the aggregator's capabilities, never
the algorithm's name. This module sits above both trainers (the decentralized one is built on the federated
one), so no module of :mod:`hf_fedflat.federation` imports it and the package does not re-export it:
``hf_fedflat.create_trainer`` does.
"""

from __future__ import annotations

import torch

from ..aggregators.gossip import is_decentralized
from ..algorithms import AGGREGATORS
from ..config import FedTrainingArguments
from ..decentralized.decentralized_trainer import DecentralizedTrainer, aggregator_parts
from .trainer import FederatedTrainer

__all__ = ["create_trainer", "trainer_class_for"]


def trainer_class_for(args: FedTrainingArguments) -> type[FederatedTrainer]:
    """:class:`DecentralizedTrainer` when the run's aggregator is decentralized, else :class:`FederatedTrainer`."""
    aggregator, _ = aggregator_parts(args)
    return DecentralizedTrainer if is_decentralized(AGGREGATORS[aggregator]) else FederatedTrainer


def create_trainer(model: torch.nn.Module, args: FedTrainingArguments, train_dataset, eval_dataset=None,
                   **kwargs) -> FederatedTrainer:
    """The trainer for ``args``' algorithm (decentralized or not), built like ``FederatedTrainer(...)``.

    Example::

        trainer = create_trainer(model, FedTrainingArguments(..., fed_algorithm="dfedgam", topology="ring"),
                                 train, test)
        trainer.train()
    """
    return trainer_class_for(args)(model, args, train_dataset, eval_dataset, **kwargs)
