"""A tiny federated run: :func:`run` trains :class:`conftest.TinyClassifier` on :data:`TRAIN` (96 rows, 6
clients, 3 per round, 4 rounds of FedGamma by default) and evaluates on :data:`TEST`; keyword arguments
override any ``FedTrainingArguments`` field."""

from __future__ import annotations

import torch

from hf_fedflat import FedTrainingArguments, FederatedTrainer

from conftest import TinyClassifier, make_tiny_dataset

TRAIN = make_tiny_dataset(n=96, seed=1)
TEST = make_tiny_dataset(n=30, seed=2)


def run(output_dir, *, resume=None, model_seed=0, callbacks=None, **overrides):
    """``(trainer, trainer.train(resume_from_checkpoint=resume))`` of the tiny run in ``output_dir``."""
    settings = dict(
        output_dir=str(output_dir), use_cpu=True, fed_algorithm="fedgamma", num_clients=6, clients_per_round=3,
        num_rounds=4, local_steps=2, per_device_train_batch_size=4, partition_scheme="iid", learning_rate=0.1,
        lr_decay_per_round=0.9, seed=7,
    )
    settings.update(overrides)
    args = FedTrainingArguments(**settings)
    torch.manual_seed(model_seed)
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels", callbacks=callbacks)
    return trainer, trainer.train(resume_from_checkpoint=resume)
