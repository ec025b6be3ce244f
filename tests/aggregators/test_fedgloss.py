"""FedGloSS's server rule (``fedgloss``): the weights sent ``w~ = w + rho_t Delta^{t-1}/||Delta^{t-1}||``, the dual
``sigma``, the pseudo-gradient and ``w^{t+1} = w - eta_s Delta^t - beta sigma`` over several rounds of partial
participation, computed by hand; with FedGH in front; and whole runs: resume, the decentralized refusal. (The
client half: ``tests/corrections/test_fedgloss.py``; two processes: ``tests/federation/test_comm.py``.)"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from hf_fedflat import FedTrainingArguments, build_algorithm
from hf_fedflat.algorithms import ClientUpdate
from hf_fedflat.state.store import unflatten_state

from helpers.runs import run
from step_helpers import server, vector

DIM = 7
#: the clients of each round (5 clients, partial participation) and their sample counts
ROUNDS = [(0, 2, 3), (1, 4), (0, 1, 2)]
SAMPLES = {0: 10, 1: 30, 2: 20, 3: 40, 4: 5}


def test_several_rounds_of_partial_participation_equal_the_formulas(tmp_path):
    rho, rho_start, warmup, beta, eta_s = 0.2, 0.02, 2, 3.0, 0.7
    algorithm = server(tmp_path, fed_algorithm="fedgloss", fedgloss_rho=rho, rho_start=rho_start,
                       rho_warmup_rounds=warmup, fedgloss_beta=beta, server_learning_rate=eta_s)
    aggregator = algorithm.aggregator
    w = vector(DIM, 1, 1.0)
    state = algorithm.init_server_state(w)
    # by hand: the server's w, the dual, the last pseudo-gradient
    hand_w, hand_sigma, hand_pseudo = w.clone(), torch.zeros(DIM), None
    for t, clients in enumerate(ROUNDS):
        sent = aggregator.broadcast_weights(t, w, state["aggregator"])
        if hand_pseudo is None:
            hand_sent = hand_w  # round 0: no ascent step
            assert torch.equal(sent, w)
        else:
            rho_t = rho_start + (rho - rho_start) * t / warmup if t < warmup else rho
            hand_sent = hand_w + rho_t * hand_pseudo / hand_pseudo.norm()
        torch.testing.assert_close(sent, hand_sent, rtol=0, atol=1e-6)

        finals = {k: hand_sent + vector(DIM, 100 * t + k, 0.3) for k in clients}  # the clients' w_k
        updates = [ClientUpdate(k, SAMPLES[k], 2, 0.0, finals[k] - sent) for k in clients]
        n_s = sum(SAMPLES[k] for k in clients)
        p = torch.tensor([SAMPLES[k] / n_s for k in clients], dtype=torch.float64)
        w, state = algorithm.server_step(t, w, updates, p, state, num_clients=5)

        hand_sigma = hand_sigma - sum(finals[k] - hand_sent for k in clients) / (beta * len(clients))
        hand_pseudo = sum(SAMPLES[k] / n_s * (hand_sent - finals[k]) for k in clients)
        hand_w = hand_w - eta_s * hand_pseudo - beta * hand_sigma
        torch.testing.assert_close(state["aggregator"]["sigma"], hand_sigma, rtol=0, atol=1e-6)
        torch.testing.assert_close(state["aggregator"]["pseudo_gradient"], hand_pseudo, rtol=0, atol=1e-6)
        torch.testing.assert_close(w, hand_w, rtol=0, atol=1e-5)
    assert aggregator.evaluation_weights(w, state["aggregator"]) is w  # the server's w is evaluated and saved


def test_fedgh_in_front_harmonizes_the_pseudo_gradient_and_keeps_the_dual_of_the_own_updates(tmp_path):
    beta = 2.0
    algorithm = server(tmp_path, fed_algorithm="fedgloss+fedgh", fedgloss_beta=beta)
    w = vector(3, 1, 1.0)
    d1, d2 = torch.tensor([1.0, 0.2, 0.0]), torch.tensor([-1.0, 0.5, 0.4])  # conflicting: d1 . d2 < 0
    h1 = d1 - (d1 @ d2) / (d2 @ d2) * d2
    h2 = d2 - (d2 @ d1) / (d1 @ d1) * d1
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    new_w, state = algorithm.server_step(0, w, [ClientUpdate(0, 1, 2, 0.0, d1), ClientUpdate(1, 3, 2, 0.0, d2)], p,
                                         algorithm.init_server_state(w), num_clients=4)
    sigma = -(d1 + d2) / (2 * beta)
    pseudo = -(0.25 * h1 + 0.75 * h2)
    torch.testing.assert_close(state["aggregator"]["sigma"], sigma, rtol=0, atol=1e-6)
    torch.testing.assert_close(state["aggregator"]["pseudo_gradient"], pseudo, rtol=0, atol=1e-6)
    torch.testing.assert_close(new_w, w - pseudo - beta * sigma, rtol=0, atol=1e-6)
    # the plug-in sends what the rule sends
    sent = algorithm.aggregator.broadcast_weights(1, new_w, state["aggregator"])
    rho_1 = 0.001 + (0.15 - 0.001) * 1 / 2000  # the defaults: round 1 of the 2000-round ramp from 0.001 to 0.15
    torch.testing.assert_close(sent, new_w + rho_1 * pseudo / pseudo.norm(), rtol=0, atol=1e-6)


# --- whole runs ------------------------------------------------------------------------------------------------
FAST_RAMP = dict(rho_warmup_rounds=3, rho_start=0.01, fedgloss_rho=0.1)


def test_clients_start_from_the_weights_sent_and_the_server_keeps_its_own(tmp_path):
    """In a run, every client's delta is measured from ``w~`` and the server state holds ``Delta^t`` and ``sigma``:
    recomputing round 2's ``w^{t+1}`` from the saved round-1 state and the round's updates gives the saved one."""
    seen = []

    class Recorder:
        def __init__(self, train_client):
            self.train_client = train_client

        def __call__(self, client_id, round_index, learning_rate, params, *rest):
            seen.append((round_index, params.clone()))
            return self.train_client(client_id, round_index, learning_rate, params, *rest)

    from hf_fedflat import FederatedTrainer

    from conftest import TinyClassifier
    from helpers.runs import TEST, TRAIN

    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedgloss", num_clients=6,
                                clients_per_round=3, num_rounds=2, local_steps=2, per_device_train_batch_size=4,
                                partition_scheme="iid", learning_rate=0.1, seed=7, save_every_n_rounds=1,
                                disable_tqdm=True, **FAST_RAMP)
    torch.manual_seed(0)
    trainer = FederatedTrainer(TinyClassifier(), args, TRAIN, TEST, label_column="labels")
    trainer.train_client = Recorder(trainer.train_client)
    trainer.train()
    first = unflatten_state(load_file(str(tmp_path / "checkpoints" / "round-1" / "server_state.safetensors")))
    w1 = load_file(str(tmp_path / "checkpoints" / "round-1" / "global_params.safetensors"))
    flat_w1 = torch.cat([w1[name].reshape(-1) for name in trainer.space.names])
    pseudo = first["aggregator"]["pseudo_gradient"]
    rho_1 = 0.01 + (0.1 - 0.01) * 1 / 3
    expected_sent = flat_w1 + rho_1 * pseudo / pseudo.norm()
    round_two = [params for r, params in seen if r == 1]
    assert len(round_two) == 3
    for params in round_two:
        torch.testing.assert_close(params, expected_sent, rtol=0, atol=1e-6)
    assert all(torch.equal(params, seen[0][1]) for r, params in seen if r == 0)  # round 0: w itself


@pytest.mark.parametrize("algorithm", ["fedgloss+fedgh", "fedgloss+swa"])
def test_resume_equals_uninterrupted(tmp_path, algorithm):
    # (s0 = 0: the cut run's num_rounds 2 would move a later start, int(fraction * num_rounds))
    settings = dict(fed_algorithm=algorithm, swa_start_fraction=0.0, swa_cycle_rounds=2, **FAST_RAMP)
    _, full = run(tmp_path / "full", **settings)
    run(tmp_path / "cut", num_rounds=2, save_every_n_rounds=1, **settings)
    _, resumed = run(tmp_path / "cut", resume="latest", model_seed=123, **settings)
    torch.testing.assert_close(resumed.params, full.params, rtol=0, atol=0)
    assert [r["eval_loss"] for r in resumed.history] == [r["eval_loss"] for r in full.history]
    assert [r["learning_rate"] for r in resumed.history] == [r["learning_rate"] for r in full.history]


def test_a_decentralized_run_refuses_the_server_rule(tmp_path):
    with pytest.raises(ValueError, match="aggregator"):
        build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="dfedsam",
                                             aggregator="fedgloss", num_clients=4, clients_per_round=2))
