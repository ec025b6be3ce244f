"""The pieces on their own: the step function without a Trainer (its reference and fast forms), the formulas' two
evaluations, the configs beside the pieces, a perturbation written in a test (one file's worth), the packages'
exports, and the rule that piece files are plain torch importing only the algorithm base."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import math
import pathlib
import sys
from types import SimpleNamespace

import pytest
import torch

from hf_fedflat.algorithms import (
    AGGREGATORS, CORRECTIONS, PERTURBATIONS, D, ClientContext, FederatedAlgorithm, LocalResult, Perturbation,
    PieceConfig, W, build_algorithm, global_norm, hyperparameter, hyperparameter_fields, list_algorithms,
    piece_defaults, piece_hyperparameters,
)
from hf_fedflat.algorithms.base import EPS, RHO_HELP
from hf_fedflat.algorithms.affine import evaluate, evaluate_, symbol
from hf_fedflat.algorithms.registry import AGGREGATOR_PLUGINS
from hf_fedflat.runtime import fast_step
from hf_fedflat.training import ParameterSpace
from hf_fedflat.training.step import takes_plain_step, training_step

from conftest import TinyClassifier, make_tiny_dataset
from step_helpers import flat, hand_grad

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hf_fedflat"


def tiny_setup():
    torch.manual_seed(0)
    model = TinyClassifier()
    data = make_tiny_dataset()
    x, y = data[:]["x"], data[:]["labels"]
    space = ParameterSpace(model)

    def backward():
        loss = model(x, labels=y)["loss"]
        loss.backward()
        return loss.detach()

    return model, space, x, y, backward


def vector(dim, seed, scale=0.1):
    return scale * torch.randn(dim, generator=torch.Generator().manual_seed(seed))


def fast_vectors(space):
    """The fast form's preallocated vectors and workspace views, as ``FastClientTrainer`` keeps them."""
    kept = {}

    def vectors(name):
        if name not in kept:
            flat = torch.empty(space.numel, dtype=space.dtype)
            kept[name] = (flat, space.split(flat))
        return kept[name]

    return dict(vectors=vectors, views=space.split)


def step_in_form(form, space, algorithm, workspaces, backward, **kwargs):
    """One micro-batch through the reference step or the runtime's fast form."""
    if form == "reference":
        return training_step(space, algorithm, workspaces, backward, **kwargs)
    return fast_step.training_step(space, algorithm, workspaces, backward, **fast_vectors(space), **kwargs)


@pytest.mark.parametrize("form", ["fast", "reference"])
def test_step_function_without_a_trainer_equals_the_formula(form):
    """LESAM's fixed offset, then prox, SCAFFOLD and momentum, at bias scale 0.5: on the tiny model, no Trainer."""
    model, space, x, y, backward = tiny_setup()
    args = SimpleNamespace(fed_algorithm="fedlesam", corrections="prox,scaffold,momentum", rho=0.2, prox_mu=0.3,
                           scaffold_lambda=0.7, momentum_alpha=0.4, lesam_direction=None)
    algorithm = build_algorithm(args)
    w0 = space.flatten()
    dim = space.numel
    w_global = w0 + vector(dim, 1)  # the client's weights are not w^t: the prox term is non-zero
    w_old, c, c_i, m = vector(dim, 2, 1.0) + w_global, vector(dim, 3), vector(dim, 4), vector(dim, 5)
    ctx = ClientContext(0, 1, w_global, broadcast={"scaffold": {"c": c}, "momentum": {"m": m, "ready": torch.ones(1)}},
                        state={"lesam": {"w_old": w_old}, "scaffold": {"c_i": c_i}}, learning_rate=0.1, num_samples=8)
    workspaces = algorithm.begin_client(ctx)
    b, rho, mu, lam, a = 0.5, 0.2, 0.3, 0.7, 0.4

    e = rho * (w_old - w_global) / ((w_old - w_global).norm() + 1e-12)
    g = flat(hand_grad(model, space.split(w0 + e), x, y))
    d = g + mu * b * (w0 - w_global) + lam * b * (c - c_i)
    expected = a * d + (1 - a) * b * m

    result = step_in_form(form, space, algorithm, workspaces, backward, bias_scale=lambda: b)
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-6)
    assert result.gradient_passes == 1 and result.in_place == (form == "fast")
    assert torch.equal(space.flatten(), w0)  # the pass at w + e left w untouched
    assert not takes_plain_step(algorithm, workspaces)


def test_in_place_and_flat_evaluations_are_bit_identical():
    """Every correction's one formula, evaluated on p.grad in place and on flat vectors: the same bits."""
    model, space, x, y, backward = tiny_setup()
    args = SimpleNamespace(fed_algorithm="fedavg", corrections="prox,scaffold,feddyn,fedup,momentum")
    algorithm = build_algorithm(args)
    dim = space.numel
    ctx = ClientContext(0, 1, space.flatten() + vector(dim, 1), learning_rate=0.05, num_samples=8,
                        broadcast={"scaffold": {"c": vector(dim, 2)}, "fedup": {"last_update": vector(dim, 3)},
                                   "momentum": {"m": vector(dim, 4), "ready": torch.ones(1)}},
                        state={"scaffold": {"c_i": vector(dim, 5)}, "feddyn": {"h": vector(dim, 6)}})
    workspaces = algorithm.begin_client(ctx)
    grads = []
    for form in ("fast", "reference"):
        space.clear_grad()
        step_in_form(form, space, algorithm, workspaces, backward, bias_scale=lambda: 0.375)
        grads.append(space.grad())
    assert torch.equal(grads[0], grads[1])
    space.clear_grad()
    backward()
    assert (grads[0] - space.grad()).abs().max() > 1e-3  # the corrections did something


def test_step_function_flat_path_adds_earlier_micro_batches():
    """SAM + FedDyn on the second micro-batch of a step: d = g_sam + alpha*b*(w - w^t + h), plus what p.grad held."""
    model, space, x, y, backward = tiny_setup()
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="fedsam", corrections="feddyn", rho=0.3,
                                                feddyn_alpha=0.2))
    w0, dim = space.flatten(), space.numel
    w_global, h = w0 + vector(dim, 7), vector(dim, 8)
    workspaces = algorithm.begin_client(ClientContext(0, 1, w_global, {}, {"feddyn": {"h": h}}, 0.1, 8))
    earlier = vector(dim, 9, 1.0)
    space.set_grad_(earlier.clone())
    b = 0.5
    g = flat(hand_grad(model, space.split(w0), x, y))
    g_sam = flat(hand_grad(model, space.split(w0 + 0.3 * g / (g.norm() + 1e-12)), x, y))
    expected = g_sam + 0.2 * b * (w0 - w_global + h) + earlier
    result = training_step(space, algorithm, workspaces, backward, bias_scale=lambda: b)
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-6)
    assert result.gradient_passes == 2 and not result.in_place


def test_step_function_plain_path_is_the_backward_alone():
    model, space, x, y, backward = tiny_setup()
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="fedavg"))
    workspaces = algorithm.begin_client(ClientContext(0, 0, space.flatten(), {}, {}, 0.1, 8))
    asked = []
    result = training_step(space, algorithm, workspaces, backward, bias_scale=lambda: asked.append(1) or 1.0)
    torch.testing.assert_close(space.grad(), flat(hand_grad(model, list(model.parameters()), x, y)), rtol=0, atol=1e-6)
    assert takes_plain_step(algorithm, workspaces) and result.gradient_passes == 1 and not result.in_place
    assert not asked  # no correction: the loss scale is never asked for (a GPU sync)


def client_context(algorithm, w, full_gradient=None):
    """A client that took part before: every client piece's server state and client state (from its own ``end``)
    with random values, as its ``begin`` would receive them."""
    g = torch.Generator().manual_seed(11)

    def noisy(parts):
        return {key: 0.01 * torch.randn(value.shape, generator=g) for key, value in parts.items()}

    broadcast = {piece.name: noisy(piece.broadcast(piece.init_server_state(w))) for piece in algorithm.client_pieces}
    ctx = ClientContext(0, 1, w, broadcast, {}, learning_rate=0.1, num_samples=8, full_gradient=full_gradient)
    result = LocalResult(w, 1, 0.01 * torch.randn(w.shape, generator=g))
    state, _ = algorithm.end_client(ctx, algorithm.begin_client(ctx), result)
    ctx.state = {name: noisy(part) for name, part in state.items()}
    return ctx


def presets_with_client_steps():
    return sorted(list_algorithms())


@pytest.mark.parametrize("preset", presets_with_client_steps())
def test_fast_step_is_bit_identical_to_the_reference_for_every_presets_pieces(preset):
    """Two micro-batches of one optimizer step (the second adds to what p.grad holds), from the same weights and
    workspaces: the same p.grad, losses and workspaces bit for bit through both forms."""
    outcomes = {}
    for form in ("reference", "fast"):
        model, space, x, y, backward = tiny_setup()

        def forward():
            return model(x, labels=y)["loss"]

        algorithm = build_algorithm(SimpleNamespace(fed_algorithm=preset, num_clients=4, seed=0))
        w = space.flatten()
        ctx = client_context(algorithm, w + vector(space.numel, 1), full_gradient=lambda: vector(space.numel, 2))
        workspaces = algorithm.begin_client(ctx)
        results = [step_in_form(form, space, algorithm, workspaces, backward, bias_scale=lambda: 0.5,
                                forward=forward) for _ in range(2)]
        assert torch.equal(space.flatten(), w)  # every pass left w untouched
        outcomes[form] = (space.grad(), [r.loss for r in results], [r.gradient_passes for r in results],
                          workspaces)
    (reference, reference_losses, reference_passes, reference_ws), (fast, fast_losses, fast_passes, fast_ws) = (
        outcomes["reference"], outcomes["fast"])
    assert torch.equal(fast, reference)
    assert all(torch.equal(a, b) for a, b in zip(fast_losses, reference_losses))
    assert fast_passes == reference_passes
    for name, workspace in reference_ws.items():
        if isinstance(workspace, dict):
            for key, value in workspace.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(fast_ws[name][key], value), (name, key)


# --- a perturbation written in a test, as one piece file would be ------------------------------------------
@dataclasses.dataclass
class AdaptiveSAMConfig(PieceConfig):
    rho: float = hyperparameter(0.5, RHO_HELP)
    asam_eta: float = hyperparameter(0.01, "ASAM: eta of the normalisation T = |w| + eta.")


class AdaptiveSAMPerturbation(Perturbation):
    """FedASAM's step (Kwon et al., ASAM, ICML 2021; in FL Caldarola et al., ECCV 2022): ``T = |w| + eta``
    (elementwise), ``e = rho * T^2 g / ||T g||``, ``d = grad F(w + e; B)``. Not registered (it would add flags to
    every run of the test session)."""

    name = "asam"
    passes_per_step = 2
    config_class = AdaptiveSAMConfig

    def direction(self, grad_at, workspace):
        c = self.config
        loss, g = grad_at(None)
        t = grad_at.weights().abs().add_(c.asam_eta)
        tg = t * g
        _, g_asam = grad_at(t * tg * (c.rho / (global_norm(tg) + EPS)))
        return loss, g_asam


@pytest.mark.parametrize("form", ["reference", "fast"])
def test_an_adaptive_perturbation_reads_the_weights_from_the_oracle(form, monkeypatch):
    """FedASAM in one test-local class through both step forms, with FedProx (which reads ``W`` too): the step equals
    the formula by hand, and the weights are copied once for both."""
    model, space, x, y, backward = tiny_setup()
    rho, eta, mu = 0.5, 0.01, 0.3
    prox = build_algorithm(SimpleNamespace(fed_algorithm="fedprox", prox_mu=mu)).corrections
    algorithm = FederatedAlgorithm("fedasam_prox", AdaptiveSAMPerturbation(AdaptiveSAMConfig(rho, eta)), prox,
                                   build_algorithm(SimpleNamespace(fed_algorithm="fedavg")).aggregator)
    w = space.flatten()
    w_global = w + vector(space.numel, 3)
    workspaces = algorithm.begin_client(ClientContext(0, 0, w_global, {}, {}, 0.1, 8))

    g = flat(hand_grad(model, space.split(w), x, y))
    t = w.abs() + eta
    e = rho * t * t * g / (t * g).norm()
    expected = flat(hand_grad(model, space.split(w + e), x, y)) + mu * (w - w_global)

    copies = []
    flatten = space.flatten
    monkeypatch.setattr(space, "flatten", lambda out=None: copies.append(1) or flatten(out=out))
    result = step_in_form(form, space, algorithm, workspaces, backward)
    torch.testing.assert_close(space.grad(), expected, rtol=0, atol=1e-6)
    assert result.gradient_passes == 2 and len(copies) == 1
    assert (e.abs() / (rho * g.abs() / g.norm())).std() > 0.1  # the offset is not SAM's: T reweights it


def test_affine_expressions_keep_the_written_terms_and_order():
    v, u = torch.arange(4.0), torch.ones(4)
    expression = 0.5 * D + 2.0 * W - 3.0 * symbol(v) + symbol(u) / 4
    assert expression.scale == 0.5 and [c for c, _ in expression.terms] == [2.0, -3.0, 0.25]
    assert expression.reads_weights and (D - 1.0 * symbol(v)).scale == 1.0
    d, w = torch.full((4,), 2.0), torch.full((4,), -1.0)
    expected = 0.5 * d + 0.1 * (2.0 * w - 3.0 * v + 0.25 * u)
    torch.testing.assert_close(evaluate(expression, d, lambda: w, 0.1), expected)
    grads = [d.clone()]
    evaluate_(expression, grads, [w], lambda flat_vector: [flat_vector], 0.1)
    assert torch.equal(grads[0], evaluate(expression, d, lambda: w, 0.1))
    assert evaluate(D, d, lambda: w) is d
    with pytest.raises(TypeError):
        D + torch.ones(4)  # a raw tensor is not a symbol: the formula must say what it adds
    with pytest.raises(TypeError):
        W * W  # not affine


# --- configs beside the pieces -----------------------------------------------------------------------------
def registered():
    return [(kind, name, cls) for kind, table in (("perturbation", PERTURBATIONS), ("correction", CORRECTIONS),
                                                   ("aggregator", AGGREGATORS)) for name, cls in table.items()]


def test_every_piece_declares_its_hyperparameters_with_help_defaults_and_checks():
    for kind, name, cls in registered():
        config = cls.config_class()
        assert isinstance(config, PieceConfig) and dataclasses.is_dataclass(config)
        config.validate()  # the piece's defaults are valid
        for f in dataclasses.fields(config):
            assert f.metadata.get("help"), f"{name}.{f.name} has no help text"
        assert piece_hyperparameters(kind, name) == tuple(f.name for f in dataclasses.fields(config))
        assert set(piece_defaults(kind, name)) == set(piece_hyperparameters(kind, name))
    fields = {f.name: f for f in hyperparameter_fields()}
    assert {"rho", "gam_alpha", "gam_rho_prime", "gam_grad_alpha", "gam_grad_beta", "gam_gamma", "lesam_direction",
            "scaffold_lambda", "prox_mu", "feddyn_alpha", "fedup_alpha", "momentum_alpha", "server_learning_rate",
            "server_beta1", "server_beta2", "server_tau", "topology", "topology_degree", "topology_redraw",
            "topology_edges", "gossip_steps"} <= set(fields)
    assert all(f.default is None for f in fields.values())
    assert "gam 0.02" in fields["rho"].metadata["help"] and "gam_original 0.2" in fields["rho"].metadata["help"]
    assert piece_hyperparameters("correction", "prox") == ("prox_mu",)
    assert piece_defaults("perturbation", "gam")["rho"] == 0.02


@pytest.mark.parametrize("field, value", [
    ("rho", -0.1), ("gam_alpha", -1.0), ("gam_grad_alpha", 1.5), ("gam_gamma", -0.1), ("lesam_direction", "nope"),
    ("scaffold_lambda", math.nan), ("prox_mu", -0.01), ("feddyn_alpha", -1.0), ("fedup_alpha", math.inf),
    ("momentum_alpha", 2.0), ("server_learning_rate", 0.0), ("server_beta1", 1.0), ("server_beta2", -0.5),
    ("server_tau", -1.0), ("topology", "star"), ("topology_degree", 0), ("gossip_steps", 0),
])
def test_each_check_names_its_field(field, value):
    declaring = [cls for _, _, cls in registered() if field in {f.name for f in dataclasses.fields(cls.config_class)}]
    assert declaring
    for cls in declaring:
        with pytest.raises(ValueError, match=f"^{field}: "):
            cls.config_class(**{field: value}).validate()


def test_graph_topology_needs_its_edges():
    from hf_fedflat.aggregators.gossip import GossipConfig

    with pytest.raises(ValueError, match="^topology_edges: "):
        GossipConfig(topology="graph").validate()


def test_build_algorithm_reads_each_piece_field_and_unset_means_the_pieces_default():
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="fedgam_cv", rho=None, scaffold_lambda=0.5))
    assert algorithm.perturbation.config.rho == 0.02 and algorithm.perturbation.config.gam_alpha == 0.2
    assert algorithm.corrections[0].config.scaffold_lambda == 0.5
    assert algorithm.aggregator.config.server_learning_rate == 1.0


# --- piece files are plain torch ---------------------------------------------------------------------------
PIECE_FILES = sorted(
    p for package in ("algorithms", "perturbations", "corrections", "aggregators") for p in (PACKAGE / package).glob("*.py")
)
FORBIDDEN = ("hf_fedflat.vectors", "hf_fedflat.runtime", "hf_fedflat.training", "hf_fedflat.federation",
             "hf_fedflat.state", "transformers", "accelerate", "ctypes")


def imported_modules(path: pathlib.Path) -> set[str]:
    """Absolute names of every module a file imports (relative imports resolved; ``from x import y`` gives x.y too)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", PIECE_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_piece_files_import_no_runtime_machinery(path):
    bad = sorted(name for name in imported_modules(path) if name.startswith(FORBIDDEN))
    assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}: piece files are plain torch"


def test_the_import_scan_sees_relative_imports():
    sample = PACKAGE / "training" / "step.py"  # machinery: it does import the runtime
    assert any(name.startswith("hf_fedflat.runtime") for name in imported_modules(sample))


PIECE_PACKAGES = ("perturbations", "corrections", "aggregators")
PIECE_MODULES = sorted(p for package in PIECE_PACKAGES for p in (PACKAGE / package).glob("*.py"))
ALGORITHM_BASE = "hf_fedflat.algorithms.base"


def imports_of(path: pathlib.Path) -> list[str]:
    """The module each import statement of a file names (relative ones resolved), one entry per statement."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append(base)
    return found


@pytest.mark.parametrize("path", PIECE_MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_piece_files_import_only_torch_the_standard_library_and_the_algorithm_base(path):
    """A piece file reads as its formula: everything of this package it needs comes from ``algorithms.base``. A
    package's ``__init__`` may also import its own modules (it registers them)."""
    own_package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
    bad = []
    for name in imports_of(path):
        top = name.split(".")[0]
        allowed = (name == ALGORITHM_BASE or top == "torch" or top == "__future__" or top in sys.stdlib_module_names
                   or (path.name == "__init__.py" and name.startswith(own_package + ".")))
        if not allowed:
            bad.append(name)
    assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}: import it from hf_fedflat.algorithms.base"


def test_the_piece_import_scan_sees_what_it_forbids():
    assert "hf_fedflat.training.step" not in imports_of(PACKAGE / "training" / "client_trainer.py")
    assert "hf_fedflat.runtime.finite_fallback" not in imports_of(PACKAGE / "training" / "step.py")  # (a package)
    assert "hf_fedflat.runtime" in imports_of(PACKAGE / "training" / "step.py")
    assert "numpy" in imports_of(PACKAGE / "algorithms" / "topology.py")


@pytest.mark.parametrize("package, tables", [
    ("perturbations", [PERTURBATIONS]), ("corrections", [CORRECTIONS]),
    ("aggregators", [AGGREGATORS, AGGREGATOR_PLUGINS]),
])
def test_each_piece_package_exports_every_piece_it_registers(package, tables):
    """The package's export list, by registered name, is the registry of its kind (plug-ins by their suffix)."""
    module = importlib.import_module(f"hf_fedflat.{package}")
    exported = [getattr(module, name) for name in module.__all__]
    pieces = [cls for cls in exported if isinstance(cls, type)]
    assert all(name == getattr(module, name).__name__ for name in module.__all__)
    assert sorted(getattr(cls, "plugin", None) or cls.name for cls in pieces) == sorted(
        name for table in tables for name in table)


def test_rho_help_names_no_piece():
    """A new rho-using piece needs no edit of the shared help: the registry adds each piece's own default."""
    assert not any(name in RHO_HELP.split() for name in PERTURBATIONS)
    help_text = {f.name: f for f in hyperparameter_fields()}["rho"].metadata["help"]
    for name, cls in PERTURBATIONS.items():
        if "rho" in {f.name for f in dataclasses.fields(cls.config_class)}:
            assert name in help_text
