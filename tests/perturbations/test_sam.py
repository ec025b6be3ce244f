"""SAM (``sam``): ``d = grad F(w + rho g/||g||)``, computed by hand on the tiny model."""

from __future__ import annotations

import torch

from hf_fedflat import build_algorithm

from step_helpers import LR, context, flat, hand_grad, make_trainer, run_client


def test_sam_step_equals_hand_computed(tmp_path, tiny_model, tiny_data):
    rho = 0.3
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="fedsam", rho=rho)
    algorithm = build_algorithm(args)
    x, y = tiny_data[:]["x"], tiny_data[:]["labels"]
    w0 = [p.detach().clone() for p in tiny_model.parameters()]

    g = hand_grad(tiny_model, w0, x, y)
    norm = flat(g).norm()
    w_adv = [w + rho * gi / (norm + 1e-12) for w, gi in zip(w0, g)]
    g_sam = hand_grad(tiny_model, w_adv, x, y)
    expected = [w - LR * gs for w, gs in zip(w0, g_sam)]

    run_client(trainer, algorithm, tiny_data, context(trainer), steps=1)
    torch.testing.assert_close(trainer.space.flatten(), flat(expected), rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 2
    # the SAM gradient really differs from the plain one here, so the check has teeth
    assert (flat(g_sam) - flat(g)).abs().max() > 1e-3
