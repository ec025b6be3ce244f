"""FedAdam's server rule (``fedadam``, Reddi et al. Alg. 2): ``m``, ``v`` from ``v_{-1} = tau^2`` (or 0) and the
step ``eta_g m / (sqrt(v) + tau)``, computed by hand."""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import FedTrainingArguments, build_algorithm
from hf_fedflat.algorithms import ClientUpdate

from step_helpers import P, server, three_updates


@pytest.mark.parametrize("v_init, v0", [(None, 0.05**2), ("tau_squared", 0.05**2), ("zero", 0.0)])
def test_fedadam_two_rounds(tmp_path, v_init, v0):
    # v_{-1} = tau^2 by default (Reddi et al. Alg. 2); the FL-Simulator code's v = 0 as an option
    algorithm = server(tmp_path, fed_algorithm="fedadam", server_beta1=0.8, server_beta2=0.9, server_tau=0.05,
                       **({} if v_init is None else {"server_v_init": v_init}))
    w = torch.linspace(-1, 1, 6)
    state = algorithm.init_server_state(w)
    m, v = torch.zeros(6), torch.full((6,), v0)
    expected = w.clone()
    for r in range(2):
        updates = three_updates()
        delta = sum(float(p) * u.delta for p, u in zip(P, updates))
        m = 0.8 * m + 0.2 * delta
        v = 0.9 * v + 0.1 * delta**2
        expected = expected + 0.1 * m / (v.sqrt() + 0.05)  # eta_g = 0.1, the preset's default
        w, state = algorithm.server_step(r, w, updates, P, state, num_clients=5)
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("v_init", ["tau_squared", "zero"])
def test_fedadam_first_step_from_the_initial_v(tmp_path, v_init):
    tau, b1, b2, eta_g = 0.05, 0.9, 0.99, 0.1
    algorithm = build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedadam",
                                                     server_tau=tau, server_v_init=v_init))
    w = torch.zeros(4, dtype=torch.float64)
    delta = torch.tensor([0.02, -0.5, 1e-4, 0.0], dtype=torch.float64)
    state = algorithm.init_server_state(w)
    new_w, _ = algorithm.server_step(0, w, [ClientUpdate(0, 1, 1, 0.0, delta)], torch.ones(1, dtype=torch.float64),
                                     state, num_clients=1)
    v = (tau ** 2 if v_init == "tau_squared" else 0.0) * b2 + (1 - b2) * delta ** 2
    torch.testing.assert_close(new_w, eta_g * (1 - b1) * delta / (v.sqrt() + tau), rtol=0, atol=1e-15)
