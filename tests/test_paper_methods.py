"""The seed methods as their papers define them (issue 19, "Fix: the seed methods as published").

Every expected value is computed here from the paper's formula, independently of the code under test: the
Hessian of the tiny model by ``torch.autograd.functional.hessian`` (a full matrix, not a double backward), the
server rules by hand on explicit vectors, in float64 where the arithmetic allows.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hf_fedflat import FedTrainingArguments, build_algorithm, create_trainer
from hf_fedflat.aggregators.fedgh import harmonize, round_seed, sequential_coefficients
from hf_fedflat.algorithms import ClientContext, ClientUpdate, get_preset
from hf_fedflat.training import ParameterSpace
from hf_fedflat.training.step import training_step

from conftest import TinyClassifier, make_tiny_dataset, tiny_loss
from step_helpers import LR, context, flat, make_trainer, run_client

EPS = 1e-12


# --- helpers --------------------------------------------------------------------------------------------------
def float64_setup(seed: int = 0):
    torch.manual_seed(seed)
    model = TinyClassifier().double()
    data = make_tiny_dataset()
    x, y = data[:]["x"].double(), data[:]["labels"]
    space = ParameterSpace(model)

    def backward():
        loss = model(x, labels=y)["loss"]
        loss.backward()
        return loss.detach()

    def forward():
        return model(x, labels=y)["loss"]

    return model, space, x, y, backward, forward


def flat_loss(model, space, x, y):
    """The loss as a function of the flat parameter vector."""
    return lambda w: tiny_loss(model, space.split(w), x, y)


def gradient(loss, w):
    w = w.detach().clone().requires_grad_(True)
    return torch.autograd.grad(loss(w), w)[0]


def hessian(loss, w):
    return torch.autograd.functional.hessian(loss, w.detach().clone())


def unit(v):
    return v / (v.norm() + EPS)


# --- 1. DFedGAM: eq. (7)-(8), Algorithm 1 ---------------------------------------------------------------------
def dfedgam_direction(loss, w, rho):
    """The paper's step direction: ``grad F(w + rho * grad||g|| / ||grad||g||||)`` with ``grad||g|| = H g/||g||``."""
    g = gradient(loss, w)
    grad_norm_g = hessian(loss, w) @ g / g.norm()
    return gradient(loss, w + rho * grad_norm_g / grad_norm_g.norm())


def test_dfedgam_double_backward_step_is_the_papers_on_float64():
    model, space, x, y, backward, forward = float64_setup()
    rho = 0.5
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="dfedgam", rho=rho, hvp_mode=None))
    w = space.flatten()
    loss = flat_loss(model, space, x, y)
    expected = dfedgam_direction(loss, w, rho)
    result = training_step(space, algorithm, algorithm.begin_client(None), backward, forward=forward)
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-11)
    assert result.gradient_passes == 3 == algorithm.passes_per_step
    assert torch.equal(space.flatten(), w)  # the weights are restored after the perturbed pass
    # no alpha and no g + term: the FedGAM form (seed 000 eq. 19) is a different direction here
    g = gradient(loss, w)
    fedgam = g + 0.2 * rho * gradient(loss, w + rho * unit(g))
    assert (expected - fedgam).norm() > 0.1 * expected.norm()
    assert (expected - gradient(loss, w + rho * unit(g))).norm() > 1e-3  # nor SAM's ascent direction


def test_dfedgam_finite_difference_option_on_float64():
    model, space, x, y, backward, forward = float64_setup()
    rho, r = 0.5, 1e-3
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="dfedgam", rho=rho, hvp_mode="finite_difference",
                                                hvp_radius=r))
    w = space.flatten()
    loss = flat_loss(model, space, x, y)
    g = gradient(loss, w)
    approx = (gradient(loss, w + r * g / g.norm()) - g) / r
    expected = gradient(loss, w + rho * approx / approx.norm())
    result = training_step(space, algorithm, algorithm.begin_client(None), backward)  # gradients only: no forward
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-11)
    assert result.gradient_passes == 3
    # the finite difference approaches the exact H g/||g|| as r -> 0
    exact = hessian(loss, w) @ g / g.norm()
    assert torch.nn.functional.cosine_similarity(approx, exact, dim=0) > 0.999
    torch.testing.assert_close(space.grad(), dfedgam_direction(loss, w, rho), rtol=0, atol=1e-3)


def test_dfedgam_double_backward_needs_the_forward_closure():
    model, space, x, y, backward, forward = float64_setup()
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="dfedgam", rho=0.1, hvp_mode=None))
    with pytest.raises(TypeError, match="forward"):
        training_step(space, algorithm, algorithm.begin_client(None), backward)
    with pytest.raises(ValueError, match="^hvp_mode: "):
        FedTrainingArguments(output_dir="/tmp/unused", use_cpu=True, fed_algorithm="dfedgam", hvp_mode="exact")
    with pytest.raises(ValueError, match="^hvp_radius: "):
        FedTrainingArguments(output_dir="/tmp/unused", use_cpu=True, fed_algorithm="dfedgam", hvp_radius=0.0)


def test_dfedgam_client_trainer_takes_two_paper_steps(tmp_path, tiny_model, tiny_data):
    """Through the Trainer (float32, the whole 8-sample dataset as one batch): y -= eta * grad F(y + delta), twice."""
    rho = 0.3
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="dfedgam", rho=rho)
    algorithm = build_algorithm(args)
    x, y = tiny_data[:]["x"].double(), tiny_data[:]["labels"]
    reference = TinyClassifier().double()
    space64 = ParameterSpace(reference)
    loss = flat_loss(reference, space64, x, y)
    w = trainer.space.flatten().double()
    for _ in range(2):
        w = w - LR * dfedgam_direction(loss, w, rho)
    run_client(trainer, algorithm, tiny_data, context(trainer), steps=2)
    torch.testing.assert_close(trainer.space.flatten().double(), w, rtol=0, atol=1e-6)
    assert trainer.gradient_passes == 6


def test_dfedgam_preset_is_the_seed_setup(tmp_path):
    spec = get_preset("dfedgam")
    assert spec.perturbation == "gam_first_order" and spec.aggregator == "gossip"
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="dfedgam")
    assert (args.hvp_mode, args.rho, args.decentralized_participation) == ("double_backward", 0.1, "full")
    assert args.topology == "random_regular" and args.topology_degree == 10  # <= 10 neighbours of 100
    # the seed's other decentralized methods: every client trains every round too
    for name in ("dfedavg", "dfedavgm", "dpsgd", "dfedsam"):
        assert FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                    fed_algorithm=name).decentralized_participation == "full"
    # an explicit choice wins; the FedGAM-form step stays available by name
    sampled = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="dfedgam",
                                   decentralized_participation="sampled", perturbation="gam")
    assert sampled.decentralized_participation == "sampled" and sampled.gam_alpha == 0.2


def test_cifar_dfedgam_recipe_defaults_to_the_seed_setup():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "recipes" / "cifar_dfedgam.py"
    spec = importlib.util.spec_from_file_location("cifar_dfedgam_recipe", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    flags = dict(zip(recipe.DEFAULTS[::2], recipe.DEFAULTS[1::2]))
    assert flags["--fed_algorithm"] == "dfedgam" and flags["--decentralized_participation"] == "full"
    assert flags["--num_clients"] == "100" and int(flags["--topology_degree"]) <= 10
    assert flags["--topology"] == "random_regular"


# --- 2. FedGAM-CV's server control variate: seed 000 eq. (22), Alg. 2 -----------------------------------------
def scaffold_server(tmp_path, **overrides):
    return build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=10,
                                                clients_per_round=3, **overrides))


@pytest.mark.parametrize("preset, average, divisor", [
    ("fedgam_cv", None, 3), ("scaffold", None, 10), ("fedgam_cv", "all_clients", 10), ("scaffold", "sampled", 3),
])
def test_server_control_variate_average(tmp_path, preset, average, divisor):
    overrides = {} if average is None else {"scaffold_server_average": average}
    algorithm = scaffold_server(tmp_path, fed_algorithm=preset, **overrides)
    w = torch.zeros(6, dtype=torch.float64)
    c = torch.linspace(-0.3, 0.4, 6, dtype=torch.float64)
    state = {"scaffold": {"c": c.clone()}}
    steps, eta = (2, 3, 5), 0.05
    updates = [ClientUpdate(i, 10, k, 0.0, torch.randn(6, generator=torch.Generator().manual_seed(i),
                                                         dtype=torch.float64)) for i, k in enumerate(steps)]
    p = torch.full((3,), 1 / 3, dtype=torch.float64)
    _, new_state = algorithm.server_step(0, w, updates, p, state, num_clients=10, learning_rate=eta)
    # c += (1/M) sum_i dc_i, dc_i = c_i+ - c_i = -c - Delta_i / (K_i * eta)  (option II)
    dc = [-c - u.delta / (u.num_steps * eta) for u in updates]
    expected = c + sum(dc) / divisor
    torch.testing.assert_close(new_state["scaffold"]["c"], expected, rtol=0, atol=1e-14)


# --- 3. conventions: each preset's paper's choice ------------------------------------------------------------
SEEDS_UNIFORM = ("fedgam", "fedgam_cv", "fedup", "fedlesam", "fedlesam_s", "fedlesam_d", "fedgh")
BASELINES_BY_SAMPLES = ("fedavg", "fedprox", "scaffold", "feddyn", "fedadam", "fednova", "fedsam", "mofedsam",
                        "fedgamma", "fedsmoo")


def test_aggregation_weights_follow_each_preset(tmp_path):
    for name in SEEDS_UNIFORM:
        assert FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                    fed_algorithm=name).aggregation_weights == "uniform", name
    for name in BASELINES_BY_SAMPLES:
        assert FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                    fed_algorithm=name).aggregation_weights == "samples", name
    explicit = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedgam",
                                    aggregation_weights="samples")
    assert explicit.aggregation_weights == "samples"
    # switching algorithm drops the preset's convention with the preset
    assert explicit.with_algorithm("fedavg").aggregation_weights == "samples"
    assert FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                fed_algorithm="fedgam").with_algorithm("fedavg").aggregation_weights == "samples"


def small_run(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path), use_cpu=True, num_clients=4, clients_per_round=4, num_rounds=1,
                    local_steps=2, per_device_train_batch_size=4, partition_scheme="dirichlet", dirichlet_alpha=0.5,
                    min_partition_size=4, learning_rate=0.1, seed=3, disable_tqdm=True, eval_every_n_rounds=1)
    settings.update(overrides)
    torch.manual_seed(0)
    trainer = create_trainer(TinyClassifier(), FedTrainingArguments(**settings), make_tiny_dataset(n=48, seed=1),
                             make_tiny_dataset(n=12, seed=2), label_column="labels")
    return trainer, trainer.train()


def test_seed_preset_averages_uniformly_in_a_run(tmp_path):
    """fedgam's round is the mean of the client updates with p_i = 1/|S_t|, not n_i / sum n_j (unequal clients)."""
    _, uniform = small_run(tmp_path / "a", fed_algorithm="fedgam", output_dir=str(tmp_path / "a"))
    trainer, by_samples = small_run(tmp_path / "b", fed_algorithm="fedgam", aggregation_weights="samples",
                                    output_dir=str(tmp_path / "b"))
    _, explicit = small_run(tmp_path / "c", fed_algorithm="fedgam", aggregation_weights="uniform",
                            output_dir=str(tmp_path / "c"))
    assert len(set(trainer.client_sizes)) > 1
    assert torch.equal(uniform.params, explicit.params)
    assert (uniform.params - by_samples.params).abs().max() > 1e-5


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


def test_mofedsam_first_round_is_zero_momentum(tmp_path, tiny_model, tiny_data):
    """Round 0, no global update yet: the paper's Delta^0 = 0 gives d = a * g_sam (rho=0: a * g)."""
    a = 0.4
    args, trainer = make_trainer(tmp_path, tiny_model, fed_algorithm="mofedsam", rho=0.0, momentum_alpha=a)
    assert args.momentum_first_round == "zero_momentum"
    algorithm = build_algorithm(args)
    x, y = tiny_data[:]["x"], tiny_data[:]["labels"]
    w = trainer.space.flatten()
    expected = w.clone()
    for _ in range(2):
        params = [t.detach().clone().requires_grad_(True) for t in trainer.space.split(expected)]
        g = flat(torch.autograd.grad(tiny_loss(tiny_model, params, x, y), params))
        expected = expected - LR * a * g
    broadcast = algorithm.broadcast(algorithm.init_server_state(w))
    run_client(trainer, algorithm, tiny_data, context(trainer, broadcast=broadcast), steps=2)
    torch.testing.assert_close(trainer.space.flatten(), expected, rtol=0, atol=1e-6)


# --- 4. FedAdam: v_{-1} = tau^2 ------------------------------------------------------------------------------
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


# --- 5. feddyn+fedgh: H = sum_i h_i ---------------------------------------------------------------------------
def test_feddyn_with_fedgh_keeps_h_sum_equal_to_the_clients_h(tmp_path):
    trainer, _ = small_run(tmp_path, fed_algorithm="feddyn+fedgh", num_clients=6, clients_per_round=3, num_rounds=3,
                           local_steps=3, dirichlet_alpha=0.5, seed=7, eval_every_n_rounds=3)
    h_sum = trainer.strategy.server_state()["aggregator"]["h_sum"]
    clients_h = sum(trainer.store.get(c).get("feddyn", {}).get("h", torch.zeros_like(h_sum)) for c in range(6))
    assert float((h_sum - clients_h).norm()) < 1e-5  # was 0.49 on this set-up before the fix
    assert float(h_sum.norm()) > 0.1


# --- 6. FedDyn's server learning rate -------------------------------------------------------------------------
@pytest.mark.parametrize("eta_g", [1.0, 0.5])
def test_feddyn_server_learning_rate(tmp_path, eta_g):
    alpha, n = 0.1, 5
    algorithm = build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="feddyn",
                                                     num_clients=n, clients_per_round=2, feddyn_alpha=alpha,
                                                     server_learning_rate=eta_g))
    w = torch.linspace(-1, 1, 6, dtype=torch.float64)
    h_sum = torch.linspace(0.2, -0.1, 6, dtype=torch.float64)
    deltas = [torch.randn(6, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in (1, 2)]
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    updates = [ClientUpdate(i, 1, 1, 0.0, d) for i, d in enumerate(deltas)]
    new_w, state = algorithm.server_step(0, w, updates, p, {"aggregator": {"h_sum": h_sum.clone()}}, num_clients=n)
    new_h = h_sum + deltas[0] + deltas[1]
    expected = w + eta_g * (0.25 * deltas[0] + 0.75 * deltas[1] + new_h / n)
    torch.testing.assert_close(new_w, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(state["aggregator"]["h_sum"], new_h, rtol=0, atol=1e-15)


# --- 7. FedGH: the paper's Algorithm 1 as an option -----------------------------------------------------------
def algorithm1_by_hand(vectors, order_seed):
    """Per client i, the others in the seeded order; project the RUNNING g_i off the ORIGINAL g~_j on conflict."""
    generator = torch.Generator().manual_seed(order_seed)
    out = []
    m = len(vectors)
    for i in range(m):
        g = vectors[i].clone()
        for j in torch.randperm(m, generator=generator).tolist():
            if j != i and g @ vectors[j] < 0:
                g = g - (g @ vectors[j]) / (vectors[j] @ vectors[j]) * vectors[j]
        out.append(g)
    return out


def test_fedgh_sequential_is_algorithm_1():
    vectors = [torch.tensor(v, dtype=torch.float64) for v in
               ([1.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [-0.2, -1.0, 0.5], [0.3, 0.2, -1.0])]
    seed = round_seed(7, [0, 1, 2, 3])
    coefficients, ratio = sequential_coefficients(vectors, seed)
    got = list(coefficients @ torch.stack(vectors))
    expected = algorithm1_by_hand(vectors, seed)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-14)
    conflicting = sum(float(vectors[i] @ vectors[j]) < 0 for i in range(4) for j in range(i + 1, 4))
    assert ratio == conflicting / 6
    # the running-vector test differs from the pairwise form on these vectors
    pairwise, _ = harmonize(vectors)
    assert max(float((p - g).norm()) for p, g in zip(pairwise, got)) > 1e-3


def test_fedgh_mode_option_reaches_the_server_step(tmp_path):
    vectors = [torch.tensor(v, dtype=torch.float64) for v in ([1.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [-0.2, -1.0, 0.5])]
    updates = [ClientUpdate(c, 1, 1, 0.0, v) for c, v in zip((4, 1, 9), vectors)]
    p = torch.full((3,), 1 / 3, dtype=torch.float64)
    w = torch.zeros(3, dtype=torch.float64)
    results = {}
    for mode in ("pairwise", "sequential"):
        algorithm = build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedgh",
                                                         num_clients=10, clients_per_round=3, seed=11, fedgh_mode=mode))
        results[mode], _ = algorithm.server_step(0, w, updates, p, {}, num_clients=10)
    expected_seq = sum(algorithm1_by_hand(vectors, round_seed(11, [4, 1, 9]))) / 3
    expected_pair = sum(harmonize(vectors)[0]) / 3
    torch.testing.assert_close(results["sequential"], expected_seq, rtol=0, atol=1e-14)
    torch.testing.assert_close(results["pairwise"], expected_pair, rtol=0, atol=1e-14)
    assert FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="fedgh").fedgh_mode == "pairwise"
