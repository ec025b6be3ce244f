"""FedNova's server rule (``fednova``): each update normalised by its local steps, times the effective steps,
computed by hand."""

from __future__ import annotations

import torch

from step_helpers import P, server, three_updates


def test_fednova_normalises_by_local_steps(tmp_path):
    algorithm = server(tmp_path, fed_algorithm="fednova")
    w = torch.zeros(6)
    updates = three_updates()
    tau_eff = 0.2 * 2 + 0.3 * 3 + 0.5 * 5
    expected = sum(float(p) * tau_eff / u.num_steps * u.delta for p, u in zip(P, updates))
    new, _ = algorithm.server_step(0, w, updates, P, algorithm.init_server_state(w), num_clients=5)
    torch.testing.assert_close(new, expected, rtol=0, atol=1e-6)
