"""The configs beside the pieces: every piece declares its hyperparameters with help, defaults and checks, and each
check names its field."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hf_fedflat.algorithms import (
    AGGREGATORS, CORRECTIONS, PERTURBATIONS, PieceConfig, hyperparameter_fields, piece_defaults, piece_hyperparameters,
)
from hf_fedflat.algorithms.base import RHO_HELP


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


def test_rho_help_names_no_piece():
    """A new rho-using piece needs no edit of the shared help: the registry adds each piece's own default."""
    assert not any(name in RHO_HELP.split() for name in PERTURBATIONS)
    help_text = {f.name: f for f in hyperparameter_fields()}["rho"].metadata["help"]
    for name, cls in PERTURBATIONS.items():
        if "rho" in {f.name for f in dataclasses.fields(cls.config_class)}:
            assert name in help_text
