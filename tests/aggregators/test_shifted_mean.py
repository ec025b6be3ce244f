"""The shifted mean (``shifted_mean``, FedDC's and FedSpeed's server rule): ``w^{t+1} = w^t + mean_i (Delta_i +
shift_i)``, with FedGH in front harmonizing the deltas before the shifts are added, computed by hand. (Each client's
shift, with its server step: ``tests/corrections/test_feddc.py``, ``tests/corrections/test_fedspeed.py``.)"""

from __future__ import annotations

import torch

from hf_fedflat.algorithms.base import DELTA_SHIFT

from step_helpers import LR, setup, update, vector


def test_feddc_with_fedgh_harmonizes_the_deltas_then_adds_the_drifts(tmp_path, tiny_model, tiny_data):
    """feddc+fedgh: w^{t+1} = w^t + mean_i (Delta~_i + h_i), Delta~ the FedGH projections of conflicting deltas; SCAFFOLD's
    c still follows the clients' own deltas."""
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddc+fedgh")
    assert algorithm.aggregator.name == "shifted_mean+fedgh"
    dim = w0.numel()
    d1 = vector(dim, 4)
    d2 = -d1 + vector(dim, 5, 0.02)
    h1, h2 = vector(dim, 6), vector(dim, 7)
    assert d1 @ d2 < 0
    g1 = d1 - (d1 @ d2) / (d2 @ d2) * d2
    g2 = d2 - (d2 @ d1) / (d1 @ d1) * d1
    new_w, state = algorithm.server_step(
        0, w0, [update(0, d1, {"feddc": {DELTA_SHIFT: h1}}), update(1, d2, {"feddc": {DELTA_SHIFT: h2}})],
        torch.tensor([0.5, 0.5]), algorithm.init_server_state(w0), 4, learning_rate=LR)
    torch.testing.assert_close(new_w, w0 + (g1 + h1 + g2 + h2) / 2, rtol=0, atol=1e-6)
    torch.testing.assert_close(state["scaffold"]["c"], -(d1 + d2) / (4 * 2 * LR), rtol=0, atol=1e-6)
