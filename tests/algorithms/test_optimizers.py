"""Pieces that assume plain SGD declare it; another local optimizer is refused or warned before training."""

from __future__ import annotations

import warnings

import pytest

from hf_fedflat import FedTrainingArguments
from hf_fedflat.algorithms.optimizers import (
    OptimizerAssumptionWarning,
    check_optimizer_compatibility,
    is_plain_sgd,
    plain_sgd_pieces,
)
from hf_fedflat.algorithms.registry import AGGREGATORS, CORRECTIONS, PERTURBATIONS


def args(tmp_path, **kwargs):
    return FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kwargs)


@pytest.mark.parametrize("optim, optim_args, plain", [
    ("sgd", None, True), ("sgd", "", True), ("sgd", "weight_decay=0.01", True), ("sgd", "momentum=0", True),
    ("sgd", "momentum=0.9", False), ("sgd", "momentum=0.0,nesterov=True", False), ("adamw_torch", None, False),
    ("adamw_torch_fused", None, False), ("adagrad", None, False),
])
def test_plain_sgd_is_sgd_without_momentum(optim, optim_args, plain):
    assert is_plain_sgd(optim, optim_args) is plain


def test_declared_pieces_and_policies():
    declared = {p.name: p.plain_sgd_policy for p in plain_sgd_pieces(
        [*PERTURBATIONS.values(), *CORRECTIONS.values(), *AGGREGATORS.values()])}
    assert declared["scaffold"] == "error"
    assert {"feddyn", "fednova", "momentum", "fedup"} <= set(declared)
    assert set(declared.values()) <= {"error", "warn"}
    for piece in plain_sgd_pieces([*CORRECTIONS.values(), *AGGREGATORS.values()]):
        assert len(piece.plain_sgd_reason) > 40  # a reason, not a flag
    # FedProx's proximal term and FedAvg's mean hold for any optimizer
    assert not plain_sgd_pieces([CORRECTIONS["prox"], AGGREGATORS["mean"]])


@pytest.mark.parametrize("optim, optim_args", [("adamw_torch", None), ("sgd", "momentum=0.9")])
def test_scaffold_with_adamw_or_momentum_is_refused_before_training(tmp_path, optim, optim_args):
    with pytest.raises(ValueError, match=r"optim: 'scaffold' assumes plain SGD on the clients \(c_i\+ = .*K\*eta.*"
                                         r"the local optimizer is (adamw_torch|sgd with momentum=0.9)\. Use --optim sgd"):
        args(tmp_path, fed_algorithm="scaffold", optim=optim, optim_args=optim_args)
    # named as a part of another preset too
    with pytest.raises(ValueError, match="optim: 'scaffold' assumes plain SGD"):
        args(tmp_path, fed_algorithm="fedavg", corrections="scaffold", optim=optim, optim_args=optim_args)


def test_scaffold_with_plain_sgd_and_fedavg_with_adamw_pass_silently(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerAssumptionWarning)
        args(tmp_path, fed_algorithm="scaffold", optim="sgd", optim_args="weight_decay=0.001")
        args(tmp_path, fed_algorithm="fedavg", optim="adamw_torch")
        args(tmp_path, fed_algorithm="fedprox", optim="adamw_torch")


@pytest.mark.parametrize("algorithm, piece", [("fednova", "fednova"), ("feddyn", "feddyn")])
def test_warned_pieces_warn_with_their_reason(tmp_path, algorithm, piece):
    with pytest.warns(OptimizerAssumptionWarning, match=rf"'{piece}' assumes plain SGD .* the local optimizer is "
                                                         r"adamw_torch, so its formula holds only approximately"):
        args(tmp_path, fed_algorithm=algorithm, optim="adamw_torch")
    # a piece used twice (feddyn's correction and aggregator are one declaration) warns once
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages = check_optimizer_compatibility([CORRECTIONS["feddyn"], CORRECTIONS["feddyn"]], "adamw_torch")
    assert len(messages) == 1 and len([w for w in caught if w.category is OptimizerAssumptionWarning]) == 1
