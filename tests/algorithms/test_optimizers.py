"""Pieces that assume plain SGD declare it; another local optimizer is refused or warned before training."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from hf_fedflat import FedTrainingArguments
from hf_fedflat.algorithms.optimizers import (
    OptimizerAssumptionWarning,
    check_optimizer_compatibility,
    is_plain_sgd,
    plain_sgd_pieces,
    plain_sgd_presets,
    resolve_local_optimizer,
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


# ------------------------------------------------------------------------------------------------------------
# optim / learning_rate left unset
# ------------------------------------------------------------------------------------------------------------
SCAFFOLD_PIECES = [PERTURBATIONS["none"], CORRECTIONS["scaffold"], AGGREGATORS["mean"]]
FEDAVG_PIECES = [PERTURBATIONS["none"], AGGREGATORS["mean"]]


@pytest.mark.parametrize("optim, learning_rate, conventions, lora, pieces, expected", [
    (None, None, True, False, FEDAVG_PIECES, ("adamw_torch", 5e-5)),        # transformers / timm: the Trainer's
    (None, None, True, True, FEDAVG_PIECES, ("adamw_torch", 2e-4)),         # LoRA adapters
    (None, None, False, False, FEDAVG_PIECES, ("sgd", 0.01)),               # built-in models: the papers'
    (None, None, False, True, FEDAVG_PIECES, ("sgd", 0.01)),
    (None, None, True, False, SCAFFOLD_PIECES, ("sgd", 0.01)),              # plain-SGD algorithm: SGD on any model
    (None, 3e-3, True, False, FEDAVG_PIECES, ("adamw_torch", 3e-3)),        # the rate given wins
    (None, 3e-3, True, False, SCAFFOLD_PIECES, ("sgd", 3e-3)),
    ("sgd", None, True, False, FEDAVG_PIECES, ("sgd", 0.01)),               # SGD's unset rate is SGD's
    ("adagrad", None, True, True, FEDAVG_PIECES, ("adagrad", 2e-4)),
    ("adamw_torch", None, False, False, FEDAVG_PIECES, ("adamw_torch", 0.01)),  # built-in model: as before
    ("adamw_torch", 0.02, True, False, FEDAVG_PIECES, ("adamw_torch", 0.02)),   # both given: untouched
])
def test_unset_optimizer_and_rate_follow_the_model_and_the_algorithm(optim, learning_rate, conventions, lora, pieces,
                                                                      expected):
    resolved = resolve_local_optimizer(optim, learning_rate, trainer_conventions=conventions, use_lora=lora,
                                       pieces=pieces)
    assert (resolved.optim, resolved.learning_rate) == expected
    assert (resolved.note == "") == (optim is not None and learning_rate is not None)
    assert resolved.kept_sgd_for == (("scaffold",) if optim is None and conventions and pieces is SCAFFOLD_PIECES
                                     else ())


def test_unset_is_none_not_equal_to_a_default(tmp_path):
    given = args(tmp_path, optim="sgd", learning_rate=0.01)  # the built-in defaults, but given
    given.apply_model_defaults(trainer_conventions=True)
    assert (given.optim.value, given.learning_rate, given.unset_optimizer_fields) == ("sgd", 0.01, ())
    unset = args(tmp_path)
    assert (unset.optim.value, unset.learning_rate) == ("sgd", 0.01)  # until the model is known
    assert unset.unset_optimizer_fields == ("optim", "learning_rate")
    unset.apply_model_defaults(trainer_conventions=True, use_lora=True)
    assert (unset.optim.value, unset.learning_rate) == ("adamw_torch", 2e-4)


def test_another_algorithm_takes_its_own_optimizer_default(tmp_path):
    run = args(tmp_path)
    run.apply_model_defaults(trainer_conventions=True)
    scaffold = run.with_algorithm("scaffold")  # AdamW would be refused: the unset optim is SGD for it
    assert (scaffold.optim.value, scaffold.learning_rate) == ("sgd", 0.01)
    assert (scaffold.with_algorithm("fedsam").optim.value, scaffold.with_algorithm("fedsam").learning_rate) == \
        ("adamw_torch", 5e-5)


def test_help_lists_the_presets_that_keep_sgd():
    presets = plain_sgd_presets()
    assert {"scaffold", "feddyn", "fednova", "fedup"} <= set(presets) and "fedavg" not in presets
    optim_help = next(f.metadata["help"] for f in dataclasses.fields(FedTrainingArguments) if f.name == "optim")
    assert all(name in optim_help for name in presets)
    assert "adamw_torch for a transformers model" in optim_help
