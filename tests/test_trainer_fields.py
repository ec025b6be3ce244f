"""Every inherited Trainer field a run uses is checked before data or model loads; unused Trainer fields are refused.

* a table of bad values of the inherited Trainer fields (and the pieces'), each through the Python API and through
  ``hf-fedflat train``: a ``ValueError`` that starts with the field's name, raised before the data loader or the
  model factory is called, with nothing written anywhere; bools and output_dir checked too;
* the refused-Trainer-flags table: every row refused with the federated field to use instead, its default
  accepted, and marked in ``--help``.

How every entry point reads a configuration (YAML, flags, recipe defaults, ``--help``'s order) is tested in
``tests/cli/test_parsing.py``; the federated fields' own checks in ``tests/test_config.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hf_fedflat import FedTrainingArguments
from hf_fedflat.cli import main
from hf_fedflat.trainer_fields import INHERITED_CHECKS, REFUSED_TRAINER_FIELDS, SEED_MAX

from helpers import forbid_loading


@pytest.fixture
def nothing_loads(monkeypatch):
    """Data loading and model building fail the test if reached."""
    forbid_loading(monkeypatch)


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ------------------------------------------------------------------------------------------------
# bad values: (id, {field: value, ...}, the field the error names)
# ------------------------------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
BAD_VALUES = [
    ("batch_0", {"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ("batch_negative", {"per_device_train_batch_size": -4}, "per_device_train_batch_size"),
    ("eval_batch_0", {"per_device_eval_batch_size": 0}, "per_device_eval_batch_size"),
    ("accumulation_0", {"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ("eval_accumulation_0", {"eval_accumulation_steps": 0}, "eval_accumulation_steps"),
    ("seed_negative", {"seed": -1}, "seed"),
    ("seed_too_big", {"seed": SEED_MAX + 1}, "seed"),
    ("lr_nan", {"learning_rate": NAN}, "learning_rate"),
    ("lr_inf", {"learning_rate": INF}, "learning_rate"),
    ("lr_zero", {"learning_rate": 0.0}, "learning_rate"),
    ("lr_negative", {"learning_rate": -0.01}, "learning_rate"),
    ("weight_decay_nan", {"weight_decay": NAN}, "weight_decay"),
    ("weight_decay_negative", {"weight_decay": -1e-4}, "weight_decay"),
    ("clip_nan", {"max_grad_norm": NAN}, "max_grad_norm"),
    ("clip_negative", {"max_grad_norm": -1.0}, "max_grad_norm"),
    ("smoothing_2", {"label_smoothing_factor": 2.0}, "label_smoothing_factor"),
    ("smoothing_1", {"label_smoothing_factor": 1.0}, "label_smoothing_factor"),
    ("smoothing_negative", {"label_smoothing_factor": -0.1}, "label_smoothing_factor"),
    ("beta1_1", {"adam_beta1": 1.0}, "adam_beta1"),
    ("beta2_negative", {"adam_beta2": -0.1}, "adam_beta2"),
    ("epsilon_negative", {"adam_epsilon": -1e-8}, "adam_epsilon"),
    ("epsilon_nan", {"adam_epsilon": NAN}, "adam_epsilon"),
    ("warmup_negative", {"warmup_steps": -1.0}, "warmup_steps"),
    ("warmup_under_constant_schedule", {"warmup_steps": 100}, "warmup_steps"),
    ("optim_unknown", {"optim": "adamz"}, "optim"),
    ("optim_args_malformed", {"optim_args": "momentum"}, "optim_args"),
    ("scheduler_unknown", {"lr_scheduler_type": "cosine_wobble"}, "lr_scheduler_type"),
    ("scheduler_kwargs_not_json", {"lr_scheduler_kwargs": "{num_cycles: 2"}, "lr_scheduler_kwargs"),
    ("workers_negative", {"dataloader_num_workers": -1}, "dataloader_num_workers"),
    ("prefetch_without_workers", {"dataloader_prefetch_factor": 2}, "dataloader_prefetch_factor"),
    ("empty_cache_0", {"torch_empty_cache_steps": 0}, "torch_empty_cache_steps"),
    ("sampling_unknown", {"train_sampling_strategy": "shuffled"}, "train_sampling_strategy"),
    ("save_total_limit_negative", {"save_total_limit": -1}, "save_total_limit"),
    ("report_to_unknown", {"report_to": "tensorbored"}, "report_to"),
    ("hub_strategy_unknown", {"hub_strategy": "sometimes"}, "hub_strategy"),
    ("fp16_and_bf16", {"fp16": True, "bf16": True}, "bf16"),
    ("weight_decay_text", {"weight_decay": "abc"}, "weight_decay"),
    ("rounds_fraction_text", {"num_rounds": "2.5"}, "num_rounds"),
    ("rho_negative", {"fed_algorithm": "fedsam", "rho": -0.05}, "rho"),
    ("prox_mu_nan", {"fed_algorithm": "fedprox", "prox_mu": NAN}, "prox_mu"),
    ("scaffold_lambda_negative", {"fed_algorithm": "scaffold", "scaffold_lambda": -5.0}, "scaffold_lambda"),
    ("server_lr_zero", {"fed_algorithm": "fedadam", "server_learning_rate": 0.0}, "server_learning_rate"),
]


def python_value(value):
    return value


def flag_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@pytest.mark.parametrize("overrides, field", [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_bad_value_in_python_names_the_field(tmp_path, overrides, field):
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match=f"^{field}: "):
        FedTrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, num_clients=4, clients_per_round=2,
                             **overrides)
    assert snapshot(tmp_path) == before


def test_warmup_steps_needs_a_schedule_with_a_warm_up(tmp_path):
    with pytest.raises(ValueError, match=r"^warmup_steps: the constant schedule \(lr_scheduler_type\) has no warm-up, so "
                                         r"100 would do nothing; pass --lr_scheduler_type constant_with_warmup \(or "
                                         r"linear, cosine\), or leave warmup_steps at 0\.$"):
        FedTrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, warmup_steps=100)
    args = FedTrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, warmup_steps=100,
                                lr_scheduler_type="constant_with_warmup")
    assert args.warmup_steps == 100


def cli_base(out: Path) -> list[str]:
    return ["train", "--dataset_name", "digits", "--output_dir", str(out), "--use_cpu", "true", "--num_clients", "4",
            "--clients_per_round", "2", "--num_rounds", "1", "--local_steps", "1"]


def expect_refused_by_cli(argv: list[str], field: str, capsys) -> None:
    """Exit status 2 with one line naming the field, or argparse's exit 2 naming the flag (a value outside a flag's
    choices)."""
    try:
        status = main(argv)
    except SystemExit as exit_:
        assert exit_.code == 2 and f"--{field}" in capsys.readouterr().err
    else:
        err = capsys.readouterr().err
        if status == 0:
            pytest.fail(f"{argv} was accepted")
        assert status == 2 and f"hf-fedflat train: error: {field}: " in err and "Traceback" not in err, err


@pytest.mark.parametrize("overrides, field", [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_bad_flag_fails_before_data_or_model_load_and_writes_nothing(tmp_path, monkeypatch, nothing_loads, capsys,
                                                                      overrides, field):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    argv = cli_base(tmp_path / "out")
    for name, value in overrides.items():
        argv += [f"--{name}", flag_value(value)]
    expect_refused_by_cli(argv, field, capsys)
    assert snapshot(tmp_path) == before  # not even output_dir was created


def test_the_table_covers_every_checked_inherited_field():
    """Each inherited field with a check has a bad value above (output_dir and the bools have their own tests)."""
    tried = {field for _, _, field in BAD_VALUES}
    own_tests = {"output_dir", "dataloader_drop_last", "dataloader_pin_memory", "dataloader_persistent_workers", "fp16",
                 "use_cpu", "disable_tqdm", "push_to_hub", "do_eval", "do_predict"}
    assert {name for name, _ in INHERITED_CHECKS} - own_tests <= tried


@pytest.mark.parametrize("field", ["dataloader_drop_last", "fp16", "use_cpu", "dataloader_pin_memory", "do_eval",
                                   "do_predict"])
def test_a_bool_field_refuses_what_is_not_a_bool(tmp_path, field):
    with pytest.raises(ValueError, match=f"^{field}: must be true or false, got 'maybe'"):
        FedTrainingArguments(output_dir=str(tmp_path), **{field: "maybe"})
    with pytest.raises(ValueError, match=f"^{field}: must be true or false, got 2"):
        FedTrainingArguments(output_dir=str(tmp_path), **{field: 2})


# ------------------------------------------------------------------------------------------------
# output_dir and the gossip graph
# ------------------------------------------------------------------------------------------------
def test_output_dir_that_is_a_file_or_under_a_file(tmp_path, monkeypatch, nothing_loads, capsys):
    a_file = tmp_path / "taken"
    a_file.write_text("not a folder")
    with pytest.raises(ValueError, match=f"^output_dir: {re.escape(str(a_file))} exists and is not a folder"):
        FedTrainingArguments(output_dir=str(a_file))
    assert main(cli_base(a_file / "run")) == 2
    assert re.search("hf-fedflat train: error: output_dir: cannot create .* is a file, not a folder",
                     capsys.readouterr().err)
    assert a_file.read_text() == "not a folder"


def test_read_only_output_dir(tmp_path, monkeypatch, nothing_loads, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: make the access check see what a user would
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == locked else real_access(path, mode))
    try:
        for target in (locked, locked / "run"):
            assert main(cli_base(target)) == 2
            assert re.search("error: output_dir: cannot write to .* is read-only", capsys.readouterr().err)
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


# ------------------------------------------------------------------------------------------------
# Trainer fields the federated loop does not use
# ------------------------------------------------------------------------------------------------
#: field -> (a non-default value, the federated field the message must name)
REFUSED = {
    "num_train_epochs": (5.0, "local_epochs"),
    "max_steps": (100, "local_steps"),
    "eval_strategy": ("epoch", "eval_every_n_rounds"),
    "eval_steps": (50.0, "eval_every_n_rounds"),
    "eval_delay": (2.0, "eval_every_n_rounds"),
    "eval_on_start": (True, "eval_every_n_rounds"),
    "save_strategy": ("epoch", "save_every_n_rounds"),
    "save_steps": (100.0, "save_every_n_rounds"),
    "save_only_model": (True, "save_every_n_rounds"),
    "save_on_each_node": (True, "save_every_n_rounds"),
    "enable_jit_checkpoint": (True, "save_every_n_rounds"),
    "ignore_data_skip": (True, "resume_from_checkpoint"),
    "restore_callback_states_from_checkpoint": (True, "resume_from_checkpoint"),
    "logging_strategy": ("epoch", "one record per round"),
    "logging_steps": (10.0, "one record per round"),
    "logging_first_step": (True, "one record per round"),
    "load_best_model_at_end": (True, "save_every_n_rounds"),
    "metric_for_best_model": ("eval_accuracy", "target_accuracy"),
    "greater_is_better": (True, "save_every_n_rounds"),
    "data_seed": (7, "seed"),
}


def test_every_refused_row_has_a_test():
    assert [row.name for row in REFUSED_TRAINER_FIELDS] == list(REFUSED)


@pytest.mark.parametrize("field", list(REFUSED))
def test_a_refused_trainer_field_names_the_federated_field(tmp_path, monkeypatch, nothing_loads, capsys, field):
    value, use_instead = REFUSED[field]
    with pytest.raises(ValueError) as error:
        FedTrainingArguments(output_dir=str(tmp_path), **{field: value})
    message = str(error.value)
    assert message.startswith(f"{field}: is not used by federated training (got {value!r}); ")
    assert use_instead in message
    # the same from the command line, before anything loads
    expect_refused_by_cli(cli_base(tmp_path / "out") + [f"--{field}", flag_value(value)], field, capsys)


def test_refused_fields_at_their_default_or_switched_off_are_fine(tmp_path):
    args = FedTrainingArguments(output_dir=str(tmp_path), eval_strategy="no", save_strategy="no", logging_strategy="no",
                                max_steps=-1, num_train_epochs=3.0)
    assert args.with_algorithm("fedsam").save_strategy == "no"  # a copy passes the checks again


def test_help_marks_the_refused_fields(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help-all"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--num_train_epochs FLOAT Refused by federated runs unless left at its default: set local_epochs" in text)


@pytest.mark.parametrize("integration, available", [("wandb", "is_wandb_available"),
                                                    ("trackio", "is_trackio_available")])
def test_a_report_to_integration_that_is_not_installed_is_refused_before_data_loads(
        tmp_path, monkeypatch, integration, available):
    from transformers.integrations import integration_utils

    monkeypatch.setattr(integration_utils, available, lambda: False)
    with pytest.raises(ValueError, match=rf"^report_to: '{integration}' is not installed here"):
        FedTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=["tensorboard", integration])
    monkeypatch.setattr(integration_utils, available, lambda: True)  # installed: accepted
    assert integration in FedTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True,
                                               report_to=integration).report_to
