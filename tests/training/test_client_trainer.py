"""The local Trainer with the algorithm's step (``training.client_trainer``, as a run builds it): a reused trainer
resets its optimizer and lr, gradient accumulation adds the corrections once, loss scaling scales them too, bf16
runs the two-pass step, clipping applies to the final direction, and FedAvg takes the Trainer's plain step."""

from __future__ import annotations

import torch

from hf_fedflat import build_algorithm
from hf_fedflat.training.step import takes_plain_step

from conftest import TinyClassifier, make_tiny_dataset
from step_helpers import LR, context, flat, hand_grad, make_trainer, run_client


def test_fedgamma_clips_the_final_direction(tmp_path, tiny_model, tiny_data):
    """SAM + SCAFFOLD composed; clipping applies to g_sam + (c - c_i), after every term."""
    rho, max_norm = 0.2, 0.05
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="fedgamma", rho=rho, max_grad_norm=max_norm)
    algorithm = build_algorithm(args)
    x, y = tiny_data[:]["x"], tiny_data[:]["labels"]
    dim = trainer.space.numel
    gen = torch.Generator().manual_seed(2)
    c, c_i = torch.randn(dim, generator=gen), torch.randn(dim, generator=gen)
    ctx = context(trainer, broadcast={"scaffold": {"c": c}}, state={"scaffold": {"c_i": c_i}})
    w0 = [p.detach().clone() for p in tiny_model.parameters()]
    g = hand_grad(tiny_model, w0, x, y)
    g_sam = hand_grad(tiny_model, [w + rho * gi / flat(g).norm() for w, gi in zip(w0, g)], x, y)
    d = flat(g_sam) + (c - c_i)
    d = d * min(1.0, max_norm / (d.norm().item() + 1e-6))
    run_client(trainer, algorithm, tiny_data, ctx, steps=1)
    torch.testing.assert_close(trainer.space.flatten(), flat(w0) - LR * d, rtol=0, atol=1e-6)


def test_gradient_accumulation_adds_corrections_once_per_step(tmp_path, tiny_data):
    """Two micro-batches of 4 with SCAFFOLD == one full batch of 8: the correction is not doubled."""
    dim_state = {}
    results = []
    for batch, accumulation in ((8, 1), (4, 2)):
        torch.manual_seed(0)
        model = TinyClassifier()
        args, trainer = make_trainer(tmp_path / f"b{batch}", model, fed_algorithm="scaffold")
        trainer.args.per_device_train_batch_size = batch
        trainer.args.gradient_accumulation_steps = accumulation
        algorithm = build_algorithm(args)
        dim = trainer.space.numel
        if not dim_state:
            gen = torch.Generator().manual_seed(3)
            dim_state["c"] = torch.randn(dim, generator=gen)
        ctx = context(trainer, broadcast={"scaffold": {"c": dim_state["c"]}})
        run_client(trainer, algorithm, tiny_data, ctx, steps=2)
        results.append(trainer.space.flatten())
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-6)


def test_fedavg_uses_the_trainers_plain_step(tmp_path, tiny_model, tiny_data):
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="fedavg")
    algorithm = build_algorithm(args)
    assert takes_plain_step(algorithm, algorithm.begin_client(context(trainer)))
    x, y = tiny_data[:]["x"], tiny_data[:]["labels"]
    w0 = [p.detach().clone() for p in tiny_model.parameters()]
    expected = [w - LR * gi for w, gi in zip(w0, hand_grad(tiny_model, w0, x, y))]
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=1)
    torch.testing.assert_close(trainer.space.flatten(), flat(expected), rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 1


def test_reused_trainer_resets_optimizer_and_lr(tmp_path, tiny_data):
    """The second client gets a fresh optimizer with its own lr: same result as a fresh trainer."""
    torch.manual_seed(0)
    model = TinyClassifier()
    args, trainer = make_trainer(tmp_path, model, fed_algorithm="fedavg", optim="sgd")
    trainer.args.optim_args = None
    algorithm = build_algorithm(args)
    start = trainer.space.flatten()
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)
    trainer.space.load_(start)
    ctx = context(trainer)
    ctx.learning_rate = 0.05
    run_client(trainer, algorithm, make_tiny_dataset(seed=5), ctx, steps=2)
    reused = trainer.space.flatten()

    torch.manual_seed(0)
    fresh_model = TinyClassifier()
    _, fresh = make_trainer(tmp_path / "fresh", fresh_model, fed_algorithm="fedavg")
    fresh_ctx = context(fresh)
    fresh_ctx.learning_rate = 0.05
    run_client(fresh, algorithm, make_tiny_dataset(seed=5), fresh_ctx, steps=2)
    torch.testing.assert_close(reused, fresh.space.flatten(), rtol=0, atol=0)


def test_loss_scaling_scales_the_correction_too(tmp_path, tiny_data):
    """Under fp16-style loss scaling the gradients arrive multiplied by S; SCAFFOLD's term must be too,
    or the unscaled step would shrink it by 1/S. With S = 8 (exact in float) the result equals fp32."""
    results = []
    for scale in (None, 8.0):
        torch.manual_seed(0)
        model = TinyClassifier()
        # no clipping: with mixed_precision "no" accelerate would clip before unscaling (real fp16 unscales first)
        args, trainer = make_trainer(tmp_path / str(scale), model, fed_algorithm="fedgamma", rho=0.1,
                                     max_grad_norm=1e6)
        if scale is not None:
            trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=10**6)
        algorithm = build_algorithm(args)
        c = torch.full((trainer.space.numel,), 0.3)
        run_client(trainer, algorithm, tiny_data, context(trainer, broadcast={"scaffold": {"c": c}}), steps=2)
        results.append(trainer.space.flatten())
        if scale is not None:
            assert trainer._bias_scale() == scale
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-6)


def test_bf16_autocast_runs_the_two_pass_step(tmp_path, tiny_model, tiny_data):
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="fedgamma", bf16=True)
    algorithm = build_algorithm(args)
    start = trainer.space.flatten()
    c = torch.zeros(trainer.space.numel)
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast={"scaffold": {"c": c}}), steps=2)
    moved = trainer.space.flatten() - start
    assert torch.isfinite(moved).all() and moved.abs().max() > 0
    assert trainer.gradient_passes == 4 and trainer.accelerator.mixed_precision == "bf16"
