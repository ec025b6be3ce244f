"""The registry: every preset and plug-in resolves to its pieces, unknown names fail clearly, ``build_algorithm``
reads each piece's fields, and each piece package exports what it registers."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from hf_fedflat import FedTrainingArguments, build_algorithm, list_algorithms
from hf_fedflat.algorithms import AGGREGATORS, CORRECTIONS, PERTURBATIONS, get_preset
from hf_fedflat.algorithms.registry import AGGREGATOR_PLUGINS

#: presets the documentation and the golden record name (the registry holds these and more)
NAMED_PRESETS = ["fedavg", "fedprox", "scaffold", "feddyn", "fedadam", "fednova", "fedsam", "mofedsam", "fedgamma",
                 "fedsmoo", "fedlesam", "fedlesam_s", "fedlesam_d", "fedgam", "fedgam_cv", "fedup", "fedgh"]


def test_every_preset_and_plugin_resolves(tmp_path):
    assert set(NAMED_PRESETS) <= set(list_algorithms())
    parts = {n: build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm=n))
             .describe() for n in list_algorithms()}
    for name, described in parts.items():  # each preset is the pieces its registration names
        spec = get_preset(name)
        assert (described["name"], described["perturbation"], described["corrections"], described["aggregator"]) == (
            name, spec.perturbation, list(spec.corrections), spec.aggregator), name
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


def test_build_algorithm_reads_each_piece_field_and_unset_means_the_pieces_default():
    algorithm = build_algorithm(SimpleNamespace(fed_algorithm="fedgam_cv", rho=None, scaffold_lambda=0.5))
    assert algorithm.perturbation.config.rho == 0.02 and algorithm.perturbation.config.gam_alpha == 0.2
    assert algorithm.corrections[0].config.scaffold_lambda == 0.5
    assert algorithm.aggregator.config.server_learning_rate == 1.0


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
