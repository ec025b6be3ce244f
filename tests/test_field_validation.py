"""Every field a run uses is checked before data or model loads; unused Trainer fields are refused; one loader.

* a table of bad values of the inherited Trainer fields (and the pieces' / topology's), each through the Python
  API and through ``hf-fedflat train``: a ``ValueError`` that starts with the field's name, raised before the
  data loader or the model factory is called, with nothing written anywhere;
* the refused-Trainer-flags table: every row refused with the federated field to use instead, its default accepted;
* YAML values that YAML 1.1 reads as strings (``1e-4``) converted for every entry point, or the field named;
* ``--help``: federated (and recipe) fields before the inherited Trainer fields, a recipe's docstring and defaults.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
from transformers import HfArgumentParser

import hf_fedflat.cli.experiment as experiment_module
from hf_fedflat import FedTrainingArguments
from hf_fedflat.cli import main, parse_train_args
from hf_fedflat.cli.parsing import parse_arguments
from hf_fedflat.trainer_fields import INHERITED_CHECKS, REFUSED_TRAINER_FIELDS, SEED_MAX

from test_recipes import ROOT, load_recipe

RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.py"))


@pytest.fixture
def nothing_loads(monkeypatch):
    """Data loading and model building fail the test if reached."""
    def loaded(*args, **kwargs):
        raise AssertionError("data or model loaded before the configuration was checked")

    monkeypatch.setattr(experiment_module, "load_data", loaded)
    monkeypatch.setattr(experiment_module, "build_model", loaded)


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
                 "use_cpu", "disable_tqdm", "push_to_hub"}
    assert {name for name, _ in INHERITED_CHECKS} - own_tests <= tried


@pytest.mark.parametrize("field", ["dataloader_drop_last", "fp16", "use_cpu", "dataloader_pin_memory"])
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


def test_a_disconnected_gossip_graph_is_refused(tmp_path):
    edges = tmp_path / "edges.json"
    edges.write_text(json.dumps([[0, 1], [2, 3]]))  # two pieces: spectral gap 0
    base = dict(output_dir=str(tmp_path / "out"), fed_algorithm="dfedavg", topology="graph", num_clients=4,
                clients_per_round=2)
    with pytest.raises(ValueError, match=r"^topology_edges: .* does not connect all 4 clients \(spectral gap 0\)"):
        FedTrainingArguments(**base, topology_edges=str(edges))
    edges.write_text(json.dumps([[0, 1], [1, 2]]))  # client 3 alone
    with pytest.raises(ValueError, match="^topology_edges: "):
        FedTrainingArguments(**base, topology_edges=str(edges))
    edges.write_text(json.dumps([[0, 1], [1, 2], [2, 3]]))  # a path: connected
    assert FedTrainingArguments(**base, topology_edges=str(edges)).topology_edges == str(edges)


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
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--num_train_epochs FLOAT Refused by federated runs unless left at its default: set local_epochs" in text)


# ------------------------------------------------------------------------------------------------
# one loader: YAML strings converted for every entry point
# ------------------------------------------------------------------------------------------------
YAML_NUMBERS = "weight_decay: 1e-4\nlearning_rate: 5e-2\nnum_rounds: 1e2\nrho: 2e-1\nuse_cpu: yes\n"


def test_yaml_1_1_strings_are_converted_by_the_cli(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path / 'out'}\nfed_algorithm: fedsam\n{YAML_NUMBERS}")
    import yaml

    assert yaml.safe_load(config.read_text())["weight_decay"] == "1e-4"  # what YAML 1.1 gives
    _, _, _, args = parse_train_args(["--config", str(config)])
    assert (args.weight_decay, args.learning_rate, args.num_rounds, args.rho, args.use_cpu) == (1e-4, 0.05, 100, 0.2, True)
    assert isinstance(args.weight_decay, float) and isinstance(args.num_rounds, int)


def test_yaml_1_1_strings_are_converted_by_the_quickstart_and_recipes(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path / 'out'}\nfed_algorithm: fedsam\n{YAML_NUMBERS}")
    quick, args, single = load_recipe("quickstart").parse([str(config)])  # a lone YAML argument
    assert (args.weight_decay, args.num_rounds, args.rho, single) == (1e-4, 100, 0.2, True)

    class Parsed(Exception):
        pass

    def capture(data_args, model_args, args, lora_args=None):
        raise Parsed(args)

    monkeypatch.setattr(experiment_module, "run_experiment", capture)
    with pytest.raises(Parsed) as parsed:
        load_recipe("mnist_fedgam").main(["--config", str(config)])
    args = parsed.value.args[0]
    assert (args.weight_decay, args.learning_rate, args.num_rounds, args.rho) == (1e-4, 0.05, 100, 0.2)


def test_yaml_1_1_strings_are_converted_by_the_python_api(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path}\n{YAML_NUMBERS}")
    (args,) = HfArgumentParser(FedTrainingArguments).parse_yaml_file(str(config))  # no flag conversion on this path
    assert (args.weight_decay, args.num_rounds, args.use_cpu) == (1e-4, 100, True)
    direct = FedTrainingArguments(output_dir=str(tmp_path), weight_decay="1e-4", per_device_train_batch_size="16",
                                  dataloader_drop_last="true")
    assert (direct.weight_decay, direct.per_device_train_batch_size, direct.dataloader_drop_last) == (1e-4, 16, True)


def test_a_value_that_is_not_of_the_field_type_is_named_with_the_file(tmp_path, nothing_loads, capsys):
    config = tmp_path / "run.yaml"
    for text, field in (("weight_decay: a lot\n", "weight_decay"), ("num_rounds: 2.5\n", "num_rounds"),
                        ("use_cpu: maybe\n", "use_cpu")):
        config.write_text(f"output_dir: {tmp_path / 'out'}\n{text}")
        assert main(["train", "--config", str(config)]) == 2
        assert re.search(f"error: {field}: .* in {re.escape(str(config))}", capsys.readouterr().err)
        with pytest.raises(ValueError, match=f"^{field}: "):
            load_recipe("quickstart").parse([str(config)])
    assert not (tmp_path / "out").exists()


def test_precedence_flags_over_config_over_smoke_over_recipe_defaults(tmp_path, monkeypatch):
    recipe = load_recipe("mnist_fedgam")
    config = tmp_path / "run.yaml"
    config.write_text("num_rounds: 30\n")

    def parsed(argv):
        return parse_train_args(argv, defaults=recipe.DEFAULTS, smoke=recipe.SMOKE)[3]

    assert parsed([]).num_rounds == 200  # the recipe's
    assert parsed(["--smoke"]).num_rounds == 2  # its smoke list
    assert parsed(["--smoke", "--config", str(config)]).num_rounds == 30  # the file wins over both
    assert parsed(["--config", str(config), "--smoke", "--num_rounds", "4"]).num_rounds == 4  # a flag wins over all
    assert parsed(["--config", str(config)]).fed_algorithm == "fedgam"  # the file leaves the rest to the recipe


# ------------------------------------------------------------------------------------------------
# --help
# ------------------------------------------------------------------------------------------------
def help_text(call, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        call()
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_train_help_lists_federated_fields_before_the_inherited_ones(capsys):
    text = help_text(lambda: main(["train", "--help"]), capsys)
    assert text.index("--fed_algorithm") < text.index("--num_clients") < text.index("--adam_beta1")
    assert text.index("federated options") < text.index("data options") < text.index("inherited Trainer options")
    first_inherited = text.index("inherited Trainer options")
    for flag in ("--num_rounds", "--local_epochs", "--rho", "--learning_rate", "--partition_scheme"):
        assert text.index(flag) < first_inherited, flag
    assert len(text.splitlines()) < 952  # the old help, federated flags at line 771
    assert text.index("--fed_algorithm") < 30 * 80  # on the first screens


def first_default(defaults: list[str]) -> tuple[str, str]:
    """The first ``--flag value`` of a recipe's defaults whose value is a plain word."""
    for flag, value in zip(defaults, defaults[1:]):
        if flag.startswith("--") and not value.startswith(("--", "{")) and len(value) < 30:
            return flag, value
    raise AssertionError("no plain default")


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_help_shows_its_docstring_and_its_defaults_first(name, capsys):
    recipe = load_recipe(name)
    text = help_text(lambda: recipe.main(["--help"]), capsys)
    first_line = recipe.__doc__.strip().splitlines()[0]
    assert first_line in text
    flag, value = first_default(recipe.DEFAULTS)
    block = text[text.index(f"\n  {flag} "):]
    block = block[:block.index("\n  --", 3)]
    assert f"(default: {value})" in " ".join(block.split()), block
    assert text.index(f"\n  {flag} ") < text.index("inherited Trainer options")
    assert "--smoke" in text


def test_every_recipe_has_a_smoke_list():
    for name in RECIPES:
        recipe = load_recipe(name)
        assert getattr(recipe, "SMOKE", None), f"recipes/{name}.py has no SMOKE settings"
        assert "--output_dir" in recipe.SMOKE and "--use_cpu" in recipe.SMOKE, name


def test_parse_arguments_refuses_unknown_config_keys_and_recipe_flags(tmp_path):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"num_round": 3}))
    with pytest.raises(ValueError, match=r"^config: unknown field\(s\) num_round in "):
        parse_arguments([FedTrainingArguments], ["--config", str(config)])
    with pytest.raises(ValueError, match="^recipe defaults: '--num_round' is not a flag"):
        parse_arguments([FedTrainingArguments], [], defaults=["--num_round", "3"])
    assert math.isclose(parse_arguments([FedTrainingArguments], ["--output_dir", str(tmp_path)],
                                        defaults=["--weight_decay", "1e-3"])[0].weight_decay, 1e-3)
