"""FedUp's upper-bound gradient (``fedup``): ``d = g + (alpha/eta)(w^{t-1} - w^t) + alpha (w - w^t)``, with the
paper's constant eta, computed by hand."""

from __future__ import annotations

import torch

from hf_fedflat import FedTrainingArguments, build_algorithm
from hf_fedflat.algorithms import ClientContext

from step_helpers import LR, context, descend, grad_at, make_trainer, run_client, setup, vector


def test_fedup_upper_bound_gradient(tmp_path, tiny_model, tiny_data):
    alpha = 0.05
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedup",
                                               fedup_alpha=alpha)
    last_update = vector(w0.numel(), 7)  # w^t - w^{t-1}
    w_prev = w0 - last_update
    expected = descend(w0, 3, lambda w: grad_at(tiny_model, trainer, w, x, y)
                       + (alpha / LR) * (w_prev - w0) + alpha * (w - w0))
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast={"fedup": {"last_update": last_update}}), 3)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_fedup_constant_eta(tmp_path, tiny_model, tiny_data):
    """FedUp's alpha/eta with the paper's constant eta (learning_rate), also when the round's lr has decayed."""
    alpha, eta_t = 0.3, 0.05  # the round's decayed lr; the run's learning_rate is LR = 0.1
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="fedup", fedup_alpha=alpha)
    assert args.fedup_eta == "constant"
    algorithm = build_algorithm(args)
    w0 = trainer.space.flatten()
    last_update = 0.01 * torch.randn(w0.numel(), generator=torch.Generator().manual_seed(5))
    ctx = ClientContext(0, 1, w0, {"fedup": {"last_update": last_update}}, {}, eta_t, 8)
    workspaces = algorithm.begin_client(ctx)
    # anchor such that the correction is alpha*W - alpha*anchor: w^t + (w^t - w^{t-1})/eta, eta = 0.1 (not 0.05)
    torch.testing.assert_close(workspaces["fedup"], w0 + last_update / LR, rtol=0, atol=1e-7)
    round_args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedup",
                                      fedup_eta="round", learning_rate=LR)
    torch.testing.assert_close(build_algorithm(round_args).begin_client(ctx)["fedup"], w0 + last_update / eta_t,
                               rtol=0, atol=1e-7)
