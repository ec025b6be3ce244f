"""LESAM (``lesam``): a fixed offset ``e = rho * unit(w_old - w^t)`` per round from the client's old global model (or
the last global update), one gradient pass per step, computed by hand; and each client's stored ``w_old`` in a run.
"""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from hf_fedflat import ParameterSpace
from hf_fedflat.algorithms import ClientUpdate, LocalResult

from conftest import TinyClassifier
from helpers.runs import run
from step_helpers import context, descend, grad_at, run_client, setup, unit, vector


def test_lesam_per_client_uses_the_old_global_model_and_one_pass(tmp_path, tiny_model, tiny_data):
    rho = 0.4
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedlesam", rho=rho)
    w_old = w0 + vector(w0.numel(), 1)
    e = rho * unit(w_old - w0)  # fixed for the whole round
    expected = descend(w0, 3, lambda w: grad_at(tiny_model, trainer, w + e, x, y))

    forwards, backwards = [], []
    tiny_model.register_forward_hook(lambda *a: forwards.append(1))
    tiny_model.net[0].weight.register_hook(lambda grad: backwards.append(1))  # one per backward
    ctx = context(trainer, state={"lesam": {"w_old": w_old}})
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)
    assert len(forwards) == 3 and len(backwards) == 3  # exactly one forward and one backward per step
    w_local = trainer.space.flatten()
    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_local, 3, w_local - ctx.global_params))
    torch.testing.assert_close(state["lesam"]["w_old"], w0, rtol=0, atol=0)  # w_old_i <- w^t
    assert messages == {}


def test_lesam_without_estimate_is_an_erm_step(tmp_path, tiny_model, tiny_data):
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedlesam", rho=0.4)
    expected = descend(w0, 2, lambda w: grad_at(tiny_model, trainer, w, x, y))
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)  # first participation: no w_old
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_lesam_last_global_update_option(tmp_path, tiny_model, tiny_data):
    rho = 0.4
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedlesam", rho=rho,
                                               lesam_direction="last_global_update")
    last_update = vector(w0.numel(), 2)  # w^t - w^{t-1}
    e = rho * unit(-last_update)
    expected = descend(w0, 2, lambda w: grad_at(tiny_model, trainer, w + e, x, y))
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast={"lesam": {"last_update": last_update}}), 2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)
    # server half: the next round's estimate is this round's global step
    state = algorithm.init_server_state(w0)
    new = w0 + 1.0
    _, state = algorithm.server_step(0, w0, [ClientUpdate(0, 8, 2, 0.0, new - w0)], torch.ones(1, dtype=torch.float64),
                                     state, num_clients=2)
    torch.testing.assert_close(state["lesam"]["last_update"], new - w0)


def test_lesam_keeps_the_global_model_each_client_last_received(tmp_path):
    """After the run, every client's stored w_old is the global model of the round it last took part in."""
    trainer, output = run(tmp_path, fed_algorithm="fedlesam", num_clients=6, clients_per_round=2, num_rounds=4,
                          save_every_n_rounds=1)
    torch.manual_seed(0)  # run() builds the model from seed 0
    globals_at_start = {0: ParameterSpace(TinyClassifier()).flatten()}
    for r in range(1, 4):  # the global model at the start of round r = checkpoint round-r
        saved = load_file(str(tmp_path / "checkpoints" / f"round-{r}" / "global_params.safetensors"))
        globals_at_start[r] = torch.cat([saved[n].reshape(-1) for n in trainer.space.names])
    last_round = {}
    for record in output.history:
        for client in record["clients"]:
            last_round[client] = record["round"] - 1
    assert len(last_round) >= 3
    for client, r in last_round.items():
        w_old = trainer.store.get(client)["lesam"]["w_old"]
        torch.testing.assert_close(w_old, globals_at_start[r], rtol=0, atol=0)
    never = set(range(6)) - set(last_round)
    assert all(trainer.store.get(c) == {} for c in never)
