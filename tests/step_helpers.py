"""Helpers for the hand-computed step tests: the local Trainer a run builds on the tiny model, gradients by
autograd."""

from __future__ import annotations

import torch

from hf_fedflat import FedTrainingArguments
from hf_fedflat.algorithms import ClientContext
from hf_fedflat.federation import local_training_arguments
from hf_fedflat.runtime.fast_trainer import client_trainer_class

from conftest import tiny_loss

LR = 0.1


def make_trainer(tmp_path, model, **overrides):
    args = FedTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, num_clients=2, clients_per_round=2, learning_rate=LR,
        per_device_train_batch_size=8, **overrides,
    )
    return args, client_trainer_class()(model=model, args=local_training_arguments(args))


def hand_grad(model, params, x, y):
    params = [p.detach().clone().requires_grad_(True) for p in params]
    return torch.autograd.grad(tiny_loss(model, params, x, y), params)


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def run_client(trainer, algorithm, data, ctx, steps):
    workspaces = algorithm.begin_client(ctx)
    trainer.start_client(data, learning_rate=ctx.learning_rate, algorithm=algorithm, workspaces=workspaces,
                         local_steps=steps)
    trainer.train()
    return workspaces


def context(trainer, broadcast=None, state=None):
    return ClientContext(client_id=0, round=0, global_params=trainer.space.flatten(), broadcast=broadcast or {},
                         state=state or {}, learning_rate=LR, num_samples=8)
