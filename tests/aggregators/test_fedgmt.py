"""FedGMT's server rule (``fedgmt``): ``d_m += w_m - w^t``; ``w^{t+1} = sum_S p_m w_m + (1/M) sum_{all M} d_m``
(or the mean of the sampled clients' ``d_m``), over several rounds with partial participation, computed by hand.
(The client objective and the moving average: ``tests/corrections/test_fedgmt.py``.)"""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import build_algorithm
from hf_fedflat.algorithms import ClientContext, LocalResult

from step_helpers import make_trainer, server, update, vector

M = 5
#: the clients sampled in each round (partial participation: 3 or 2 of 5, some twice)
ROUNDS = [(0, 2, 4), (1, 2), (2, 3, 4), (0, 1)]


def _weights(clients):
    n = torch.tensor([float(10 + c) for c in clients], dtype=torch.float64)
    return n / n.sum()


@pytest.mark.parametrize("dual_average", ["all_clients", "sampled"])
def test_fedgmt_server_rule_over_rounds(tmp_path, dual_average):
    algorithm = server(tmp_path, fed_algorithm="fedgmt", fedgmt_dual_average=dual_average)  # M = 5 clients
    w = torch.linspace(-1, 1, 6, dtype=torch.float64)
    state = algorithm.init_server_state(w)
    duals = {c: torch.zeros(6, dtype=torch.float64) for c in range(M)}  # d_m of every client, by hand
    for r, clients in enumerate(ROUNDS):
        updates = []
        for c in clients:
            delta = vector(6, 100 * r + c, 0.3).double()
            # the client half's message (its d_m, sent only when the server averages the sampled clients')
            ctx = context_for(w, c, duals, state, algorithm)
            _, messages = algorithm.end_client(ctx, algorithm.begin_client(ctx), LocalResult(w + delta, 2, delta))
            updates.append(update(c, delta, messages=messages))
            duals[c] = duals[c] + delta
        p = _weights(clients)
        mean = sum(float(pi) * (w + u.delta) for pi, u in zip(p, updates))
        if dual_average == "all_clients":
            expected = mean + sum(duals.values()) / M
        else:
            expected = mean + sum(duals[c] for c in clients) / len(clients)
        w, state = algorithm.server_step(r, w, updates, p, state, num_clients=M)
        torch.testing.assert_close(w, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(state["aggregator"]["dual_sum"], sum(duals.values()), rtol=0, atol=1e-12)


def context_for(w, client, duals, state, algorithm):
    return ClientContext(client, 0, w, algorithm.broadcast(state), {"fedgmt": {"dual": duals[client]}},
                         learning_rate=0.1, num_samples=8)


def test_the_preset(tmp_path, tiny_model):
    args, _ = make_trainer(tmp_path, tiny_model, fed_algorithm="fedgmt")
    algorithm = build_algorithm(args)
    config = algorithm.corrections[0].config
    assert (config.fedgmt_ema, config.fedgmt_gamma, config.fedgmt_tau, config.fedgmt_beta) == (0.95, 1.0, 3.0, 10.0)
    assert (algorithm.aggregator.name, args.aggregation_weights) == ("fedgmt", "samples")
