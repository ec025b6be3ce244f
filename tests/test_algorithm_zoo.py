"""Every perturbation, correction and aggregator of ALGORITHMS.md against its formula, computed by hand.

The tiny model sees its whole 8-sample dataset as one batch, so every local step's gradient is the
full-data gradient at the current weights, which the tests compute independently with autograd.
"""

from __future__ import annotations

import pytest
import torch

from hf_fedflat import FedTrainingArguments, build_algorithm, list_algorithms
from hf_fedflat.algorithms import ClientUpdate, LocalResult, RoundSummary
from hf_fedflat.aggregators import harmonize

from step_helpers import LR, context, flat, hand_grad, make_trainer, run_client

EPS = 1e-12


def setup(tmp_path, model, data, **overrides):
    args, trainer = make_trainer(tmp_path, model, **overrides)
    x, y = data[:]["x"], data[:]["labels"]
    w0 = trainer.space.flatten()
    return args, trainer, build_algorithm(args), x, y, w0


def grad_at(model, trainer, w, x, y):
    """Full-data gradient at the flat weights ``w``, as a flat vector."""
    return flat(hand_grad(model, trainer.space.split(w), x, y))


def descend(w0, steps, direction):
    """``w_{k+1} = w_k - LR * direction(w_k)``."""
    w = w0.clone()
    for _ in range(steps):
        w = w - LR * direction(w)
    return w


def unit(v):
    return v / (v.norm() + EPS)


def random_vector(dim, seed, scale=0.1):
    return scale * torch.randn(dim, generator=torch.Generator().manual_seed(seed))


# --- perturbations ---------------------------------------------------------------------------------------
def test_gam_fedgam_form(tmp_path, tiny_model, tiny_data):
    rho, alpha = 0.3, 0.5
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedgam", rho=rho,
                                               gam_alpha=alpha)
    g = lambda w: grad_at(tiny_model, trainer, w, x, y)  # noqa: E731
    expected = descend(w0, 2, lambda w: g(w) + alpha * rho * g(w + rho * unit(g(w))))
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 4 and algorithm.passes_per_step == 2
    assert args.rho == rho and FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                    fed_algorithm="fedgam").rho == 0.02


def test_gam_original_accelerated_form(tmp_path, tiny_model, tiny_data):
    rho, rho_p, a, b, gamma = 0.3, 0.05, 0.2, 0.3, 0.4
    args, trainer, algorithm, x, y, w0 = setup(
        tmp_path, tiny_model, tiny_data, perturbation="gam_original", rho=rho, gam_rho_prime=rho_p,
        gam_grad_alpha=a, gam_grad_beta=b, gam_gamma=gamma,
    )
    g = lambda w: grad_at(tiny_model, trainer, w, x, y)  # noqa: E731

    def direction(w):
        g0 = g(w)
        g1 = g(w + rho_p * unit(g0))
        w2 = w + rho * unit(g1 - g0)
        g2 = g(w2)
        g3 = g(w2 + rho_p * unit(g2))
        h_plus, h_minus = a * g1 + (1 - a) * g3, b * g0 + (1 - b) * g2
        orthogonal = h_minus - (h_minus @ h_plus) / (h_plus @ h_plus) * h_plus
        return h_plus - gamma * orthogonal

    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), descend(w0, 2, direction), rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 8


def test_lesam_per_client_uses_the_old_global_model_and_one_pass(tmp_path, tiny_model, tiny_data):
    rho = 0.4
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedlesam", rho=rho)
    w_old = w0 + random_vector(w0.numel(), 1)
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
    last_update = random_vector(w0.numel(), 2)  # w^t - w^{t-1}
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


def test_smoo_corrected_perturbation_state_and_server(tmp_path, tiny_model, tiny_data):
    rho = 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, perturbation="smoo", corrections="",
                                               aggregator="mean", rho=rho)
    dim = w0.numel()
    s, mu0 = random_vector(dim, 3), random_vector(dim, 4)
    mu = mu0.clone()

    def direction(w):
        nonlocal mu
        g_hat = grad_at(tiny_model, trainer, w, x, y) - mu - s
        e = rho * unit(g_hat)
        mu = mu + e - s
        return grad_at(tiny_model, trainer, w + e, x, y)

    expected = descend(w0, 2, direction)
    ctx = context(trainer, broadcast={"smoo": {"s": s}}, state={"smoo": {"mu": mu0}})
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)
    w_local = trainer.space.flatten()
    state, messages = algorithm.end_client(ctx, workspaces, LocalResult(w_local, 2, w_local - ctx.global_params))
    torch.testing.assert_close(state["smoo"]["mu"], mu, rtol=0, atol=1e-6)
    # server: s = rho * mean(mu_i) / ||mean(mu_i)||
    other_mu = random_vector(dim, 5)
    updates = [ClientUpdate(0, 8, 2, 0.0, torch.zeros(dim), messages=messages),
               ClientUpdate(1, 8, 2, 0.0, torch.zeros(dim), messages={"smoo": {"mu": other_mu}})]
    _, server = algorithm.server_step(0, w0, updates, torch.tensor([0.5, 0.5], dtype=torch.float64),
                                      {"smoo": {"s": s}}, num_clients=4)
    mean_mu = (mu + other_mu) / 2
    torch.testing.assert_close(server["smoo"]["s"], rho * mean_mu / mean_mu.norm(), rtol=0, atol=1e-6)


# --- corrections -----------------------------------------------------------------------------------------
def test_prox_term(tmp_path, tiny_model, tiny_data):
    mu = 0.7
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedprox", prox_mu=mu)
    expected = descend(w0, 3, lambda w: grad_at(tiny_model, trainer, w, x, y) + mu * (w - w0))
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=3)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_feddyn_term_and_client_state(tmp_path, tiny_model, tiny_data):
    alpha = 0.5
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="feddyn",
                                               feddyn_alpha=alpha)
    h = random_vector(w0.numel(), 6)
    expected = descend(w0, 3, lambda w: grad_at(tiny_model, trainer, w, x, y) + alpha * (w - w0) + alpha * h)
    ctx = context(trainer, state={"feddyn": {"h": h}})
    workspaces = run_client(trainer, algorithm, tiny_data, ctx, steps=3)
    w_local = trainer.space.flatten()
    torch.testing.assert_close(w_local, expected, rtol=0, atol=1e-6)
    state, _ = algorithm.end_client(ctx, workspaces, LocalResult(w_local, 3, w_local - ctx.global_params))
    torch.testing.assert_close(state["feddyn"]["h"], h + (w_local - w0), rtol=0, atol=1e-6)


def test_fedup_upper_bound_gradient(tmp_path, tiny_model, tiny_data):
    alpha = 0.05
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="fedup",
                                               fedup_alpha=alpha)
    last_update = random_vector(w0.numel(), 7)  # w^t - w^{t-1}
    w_prev = w0 - last_update
    expected = descend(w0, 3, lambda w: grad_at(tiny_model, trainer, w, x, y)
                       + (alpha / LR) * (w_prev - w0) + alpha * (w - w0))
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast={"fedup": {"last_update": last_update}}), 3)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_momentum_mixes_the_last_global_update(tmp_path, tiny_model, tiny_data):
    a = 0.3
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, perturbation="none",
                                               corrections="momentum", momentum_alpha=a)
    dim = w0.numel()
    # server half: m = -(sum p_i Delta_i) / (K * eta) with K the weighted mean of local steps
    d1, d2 = random_vector(dim, 8), random_vector(dim, 9)
    updates = [ClientUpdate(0, 8, 2, 0.0, d1), ClientUpdate(1, 8, 4, 0.0, d2)]
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    state = algorithm.init_server_state(w0)
    _, state = algorithm.server_step(0, w0, updates, p, state, num_clients=2, learning_rate=0.2)
    m = -(0.25 * d1 + 0.75 * d2) / ((0.25 * 2 + 0.75 * 4) * 0.2)
    torch.testing.assert_close(state["momentum"]["m"], m, rtol=0, atol=1e-7)
    expected = descend(w0, 2, lambda w: a * grad_at(tiny_model, trainer, w, x, y) + (1 - a) * m)
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast=algorithm.broadcast(state)), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


def test_momentum_round_zero_leaves_the_gradient(tmp_path, tiny_model, tiny_data):
    # (the mofedsam preset's own default is the paper's zero momentum, tests/test_paper_methods.py)
    args, trainer, algorithm, x, y, w0 = setup(tmp_path, tiny_model, tiny_data, fed_algorithm="mofedsam", rho=0.0,
                                               momentum_first_round="unchanged")
    broadcast = algorithm.broadcast(algorithm.init_server_state(w0))
    expected = descend(w0, 2, lambda w: grad_at(tiny_model, trainer, w, x, y))  # rho=0: SAM is the gradient
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast=broadcast), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


# --- aggregators -----------------------------------------------------------------------------------------
def server(tmp_path, **overrides):
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=5, clients_per_round=3,
                                **overrides)
    return build_algorithm(args)


def three_updates(dim=6, steps=(2, 3, 5)):
    return [ClientUpdate(i, 10 * (i + 1), k, 0.0, random_vector(dim, 20 + i, 1.0)) for i, k in enumerate(steps)]


P = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)


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


def test_fednova_normalises_by_local_steps(tmp_path):
    algorithm = server(tmp_path, fed_algorithm="fednova")
    w = torch.zeros(6)
    updates = three_updates()
    tau_eff = 0.2 * 2 + 0.3 * 3 + 0.5 * 5
    expected = sum(float(p) * tau_eff / u.num_steps * u.delta for p, u in zip(P, updates))
    new, _ = algorithm.server_step(0, w, updates, P, algorithm.init_server_state(w), num_clients=5)
    torch.testing.assert_close(new, expected, rtol=0, atol=1e-6)


def test_feddyn_server_rule_over_two_rounds(tmp_path):
    algorithm = server(tmp_path, fed_algorithm="feddyn")
    w = torch.linspace(0, 1, 6)
    state = algorithm.init_server_state(w)
    h = {i: torch.zeros(6) for i in range(5)}  # h_i of every client, by hand
    for r in range(2):
        updates = three_updates()
        for u in updates:
            h[u.client_id] = h[u.client_id] + u.delta
        expected = sum(float(p) * (w + u.delta) for p, u in zip(P, updates)) + sum(h.values()) / 5
        w, state = algorithm.server_step(r, w, updates, P, state, num_clients=5)
        torch.testing.assert_close(w, expected, rtol=0, atol=1e-6)


def explicit_harmonize(vectors):
    """FedGH written out: every conflicting pair (originals) projected, sequentially, with the originals."""
    originals = [v.clone() for v in vectors]
    g = [v.clone() for v in vectors]
    for i in range(len(g)):
        for j in range(i + 1, len(g)):
            if originals[i] @ originals[j] < 0:
                gi, gj = g[i].clone(), g[j].clone()
                g[i] = gi - (gi @ originals[j]) / (originals[j] @ originals[j]) * originals[j]
                g[j] = gj - (gj @ originals[i]) / (originals[i] @ originals[i]) * originals[i]
    return g


def test_fedgh_matches_the_explicit_projection():
    vectors = [torch.tensor(v, dtype=torch.float64) for v in
               ([1.0, 0.2, -0.5, 0.0], [-0.8, 1.0, 0.3, 0.1], [0.5, -1.0, 0.2, 0.7], [-0.3, -0.4, 1.0, -0.9])]
    harmonized, ratio = harmonize(vectors)
    for got, want in zip(harmonized, explicit_harmonize(vectors)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    conflicts = sum(int(vectors[i] @ vectors[j] < 0) for i in range(4) for j in range(i + 1, 4))
    assert 0 < conflicts and ratio == conflicts / 6


def test_fedgh_leaves_agreeing_updates_and_resolves_a_conflicting_pair():
    agreeing = [torch.tensor([1.0, 0.5, 0.0]), torch.tensor([0.2, 1.0, 0.3])]
    same, ratio = harmonize(agreeing)
    assert ratio == 0.0 and all(torch.equal(a, b) for a, b in zip(same, agreeing))
    conflicting = [torch.tensor([1.0, 0.2, 0.0]), torch.tensor([-1.0, 0.5, 0.4])]
    assert conflicting[0] @ conflicting[1] < 0
    (gi, gj), ratio = harmonize(conflicting)
    assert ratio == 1.0 and gi @ gj >= 0
    assert abs(gi @ conflicting[1]) < 1e-6 and abs(gj @ conflicting[0]) < 1e-6  # each orthogonal to the other


@pytest.mark.parametrize("base, recombined_weights", [("fedadam", True), ("fedavg", True), ("fednova", False)])
def test_fedgh_plugs_in_front_of_any_aggregator(tmp_path, base, recombined_weights):
    """Linear rules (mean, FedAdam) get the original updates with weights C^T p, the others the harmonized
    updates; both equal the base rule applied to the explicitly harmonized updates."""
    updates = three_updates()
    updates[1].delta = -updates[0].delta + 0.1  # force a conflict
    harmonized = explicit_harmonize([u.delta.double() for u in updates])
    w = torch.zeros(6)
    plain = server(tmp_path, fed_algorithm=base)
    with_gh = server(tmp_path, fed_algorithm=f"{base}+fedgh")
    assert with_gh.aggregator.name == f"{plain.aggregator.name}+fedgh"
    assert with_gh.aggregator.base.capabilities.linear_in_weighted_delta == recombined_weights
    expected, _ = plain.server_step(0, w, [ClientUpdate(u.client_id, u.num_samples, u.num_steps, 0.0, d.float())
                                           for u, d in zip(updates, harmonized)], P, plain.init_server_state(w), 5)
    got, _ = with_gh.server_step(0, w, updates, P, with_gh.init_server_state(w), 5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    unharmonized, _ = plain.server_step(0, w, updates, P, plain.init_server_state(w), 5)
    assert (unharmonized - expected).abs().max() > 1e-3  # harmonizing changed the result: the check has teeth


def test_gram_matrix_in_blocks_equals_the_full_product(monkeypatch):
    from hf_fedflat.aggregators import fedgh

    monkeypatch.setattr(fedgh, "GRAM_BLOCK_COLUMNS", 7)  # 50 columns: 7 full blocks and a short one
    vectors = [torch.randn(50, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i in range(5)]
    stacked = torch.stack(vectors)
    torch.testing.assert_close(fedgh.gram_matrix(vectors), stacked @ stacked.T, rtol=0, atol=1e-12)
    single = [v.float() for v in vectors]  # float32 blocks, float64 sum
    torch.testing.assert_close(fedgh.gram_matrix(single), stacked @ stacked.T, rtol=0, atol=1e-5)


def test_all_seventeen_presets_and_plugins_resolve(tmp_path):
    names = ["fedavg", "fedprox", "scaffold", "feddyn", "fedadam", "fednova", "fedsam", "mofedsam", "fedgamma",
             "fedsmoo", "fedlesam", "fedlesam_s", "fedlesam_d", "fedgam", "fedgam_cv", "fedup", "fedgh"]
    assert set(names) <= set(list_algorithms())
    parts = {n: build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm=n))
             .describe() for n in names}
    assert parts["fedlesam_d"] == {"name": "fedlesam_d", "perturbation": "lesam", "corrections": ["feddyn"],
                                   "aggregator": "feddyn", "passes_per_step": 1}
    assert parts["fedgam_cv"]["corrections"] == ["scaffold"] and parts["fedsmoo"]["aggregator"] == "fedsmoo"
    composed = build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                    fed_algorithm="fedlesam_s+fedgh")).describe()
    assert composed["perturbation"] == "lesam" and composed["aggregator"] == "mean+fedgh"
    direct = build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, perturbation="gam",
                                                  corrections="prox,scaffold", aggregator="fednova+fedgh")).describe()
    assert direct["corrections"] == ["prox", "scaffold"] and direct["aggregator"] == "fednova+fedgh"


@pytest.mark.parametrize("name, message", [
    ("fedavg+nope", "not an aggregator plug-in"), ("nope", "not a known algorithm"),
])
def test_unknown_names_fail_clearly(tmp_path, name, message):
    with pytest.raises(ValueError, match=message):
        FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm=name)
