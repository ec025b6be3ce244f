"""Helpers for the hand-computed step tests (``tests/`` is on ``sys.path``: ``from step_helpers import ...``).

* the local Trainer a run builds on the tiny model, and one client's local training through it
  (:func:`make_trainer`, :func:`context`, :func:`run_client`, :func:`setup`);
* gradients by autograd, independent of the code under test (:func:`hand_grad`, :func:`grad_at`, :func:`grad_of`)
  and the descent a formula gives (:func:`descend`);
* the step function without a Trainer, in its reference or its fast form (:func:`tiny_setup`,
  :func:`step_in_form`);
* hand-made server inputs (:func:`update`, :func:`server`, :func:`three_updates`, :data:`P`) and a small
  federated run (:func:`small_run`).
"""

from __future__ import annotations

import torch

from hf_fedflat import FedTrainingArguments, build_algorithm, create_trainer
from hf_fedflat.algorithms import ClientContext, ClientUpdate
from hf_fedflat.federation import local_training_arguments
from hf_fedflat.runtime import fast_step
from hf_fedflat.runtime.fast_trainer import client_trainer_class
from hf_fedflat.training import ParameterSpace
from hf_fedflat.training.step import training_step

from conftest import TinyClassifier, make_tiny_dataset, tiny_loss

LR = 0.1
EPS = 1e-12


# --- one client through the local Trainer -------------------------------------------------------------------
def make_trainer(tmp_path, model, **overrides):
    args = FedTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, num_clients=2, clients_per_round=2, learning_rate=LR,
        per_device_train_batch_size=8, **overrides,
    )
    return args, client_trainer_class()(model=model, args=local_training_arguments(args))


def setup(tmp_path, model, data, **overrides):
    """``(args, trainer, algorithm, x, y, w0)``: the local Trainer on ``model``, the algorithm its arguments name,
    the whole tiny dataset as one batch and the starting weights."""
    args, trainer = make_trainer(tmp_path, model, **overrides)
    x, y = data[:]["x"], data[:]["labels"]
    return args, trainer, build_algorithm(args), x, y, trainer.space.flatten()


def run_client(trainer, algorithm, data, ctx, steps):
    workspaces = algorithm.begin_client(ctx)
    trainer.start_client(data, learning_rate=ctx.learning_rate, algorithm=algorithm, workspaces=workspaces,
                         local_steps=steps)
    trainer.train()
    return workspaces


def context(trainer, broadcast=None, state=None):
    return ClientContext(client_id=0, round=0, global_params=trainer.space.flatten(), broadcast=broadcast or {},
                         state=state or {}, learning_rate=LR, num_samples=8)


# --- gradients and descents by hand -------------------------------------------------------------------------
def hand_grad(model, params, x, y):
    params = [p.detach().clone().requires_grad_(True) for p in params]
    return torch.autograd.grad(tiny_loss(model, params, x, y), params)


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def grad_at(model, trainer, w, x, y):
    """Full-data gradient at the flat weights ``w``, as a flat vector."""
    return flat(hand_grad(model, trainer.space.split(w), x, y))


def grad_of(objective, trainer, w):
    """Gradient of ``objective(params)`` at the flat weights ``w`` (independent of the training step)."""
    params = [p.detach().clone().requires_grad_(True) for p in trainer.space.split(w)]
    return flat(torch.autograd.grad(objective(params), params))


def descend(w0, steps, direction):
    """``w_{k+1} = w_k - LR * direction(w_k)``."""
    w = w0.clone()
    for _ in range(steps):
        w = w - LR * direction(w)
    return w


def unit(v):
    return v / (v.norm() + EPS)


def vector(dim, seed, scale=0.1):
    return scale * torch.randn(dim, generator=torch.Generator().manual_seed(seed))


def features(params, x):
    """The tiny model's representation at explicit parameters ``[W1, b1, W2, b2]``: ``tanh(x W1^T + b1)`` (the
    input of its last layer)."""
    return torch.tanh(x @ params[0].T + params[1])


# --- the step function without a Trainer ---------------------------------------------------------------------
def tiny_setup():
    """``(model, space, x, y, backward)``: the tiny model, its parameter space, the whole tiny dataset and the
    backward pass of its loss."""
    torch.manual_seed(0)
    model = TinyClassifier()
    data = make_tiny_dataset()
    x, y = data[:]["x"], data[:]["labels"]
    space = ParameterSpace(model)

    def backward():
        loss = model(x, labels=y)["loss"]
        loss.backward()
        return loss.detach()

    return model, space, x, y, backward


def fast_vectors(space):
    """The fast form's preallocated vectors and workspace views, as ``FastClientTrainer`` keeps them."""
    kept = {}

    def vectors(name):
        if name not in kept:
            flat = torch.empty(space.numel, dtype=space.dtype)
            kept[name] = (flat, space.split(flat))
        return kept[name]

    return dict(vectors=vectors, views=space.split)


def step_in_form(form, space, algorithm, workspaces, backward, **kwargs):
    """One micro-batch through the reference step or the runtime's fast form."""
    if form == "reference":
        return training_step(space, algorithm, workspaces, backward, **kwargs)
    return fast_step.training_step(space, algorithm, workspaces, backward, **fast_vectors(space), **kwargs)


# --- server inputs by hand -----------------------------------------------------------------------------------
def update(client_id, delta, messages=None, steps=2):
    """A client's update of 8 samples and ``steps`` local steps."""
    return ClientUpdate(client_id, 8, steps, 0.0, delta, messages=messages or {})


def server(tmp_path, **overrides):
    """The algorithm of a run of 5 clients, 3 per round (for its server step)."""
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=5, clients_per_round=3,
                                **overrides)
    return build_algorithm(args)


def three_updates(dim=6, steps=(2, 3, 5)):
    return [ClientUpdate(i, 10 * (i + 1), k, 0.0, vector(dim, 20 + i, 1.0)) for i, k in enumerate(steps)]


P = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)


def small_run(tmp_path, **overrides):
    """``(trainer, output)`` of one round of 4 unequal (Dirichlet) clients on 48 rows; overrides any field."""
    settings = dict(output_dir=str(tmp_path), use_cpu=True, num_clients=4, clients_per_round=4, num_rounds=1,
                    local_steps=2, per_device_train_batch_size=4, partition_scheme="dirichlet", dirichlet_alpha=0.5,
                    min_partition_size=4, learning_rate=0.1, seed=3, disable_tqdm=True, eval_every_n_rounds=1)
    settings.update(overrides)
    torch.manual_seed(0)
    trainer = create_trainer(TinyClassifier(), FedTrainingArguments(**settings), make_tiny_dataset(n=48, seed=1),
                             make_tiny_dataset(n=12, seed=2), label_column="labels")
    return trainer, trainer.train()
