"""One way every entry point reads its configuration (``hf_fedflat.cli.parsing``): YAML values that YAML 1.1 reads
as strings (``1e-4``) converted for the CLI, the recipes and the Python API, or the field named with the file;
flags over the config file over ``--smoke`` over a recipe's defaults; unknown keys and flags refused; ``--help``
listing the federated (and data, model) fields before the inherited Trainer fields, each field once."""

from __future__ import annotations

import json
import math
import re

import pytest
from transformers import HfArgumentParser, TrainingArguments

import hf_fedflat.cli.experiment as experiment_module
from hf_fedflat import FedTrainingArguments
from hf_fedflat.cli import main, parse_train_args
from hf_fedflat.cli.parsing import parse_arguments

from helpers import forbid_loading, help_text, load_recipe


@pytest.fixture
def nothing_loads(monkeypatch):
    """Data loading and model building fail the test if reached."""
    forbid_loading(monkeypatch)


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


def test_a_config_file_first_then_flags_reads_the_file_and_the_flags_win(tmp_path, nothing_loads, capsys):
    """`hf-fedflat train x.yaml --num_rounds 2`: the file as the first argument, as `--config x.yaml`."""
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path / 'out'}\nfed_algorithm: fedsam\nnum_rounds: 30\nrho: 0.2\n")
    _, _, _, args = parse_train_args([str(config), "--num_rounds", "2"])
    assert (args.fed_algorithm, args.num_rounds, args.rho) == ("fedsam", 2, 0.2)
    _, _, _, args = parse_train_args([str(config)])
    assert args.num_rounds == 30
    assert main(["train", str(config), "--config", str(config)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"hf-fedflat train: error: config: given twice ({config} and --config {config}); give one file.")


def _option_lines(text: str) -> list[str]:
    return re.findall(r"^  (?:-h, )?(--[\w-]+)", text, flags=re.M)


def test_train_help_shows_the_users_fields_then_the_chosen_algorithms_hyperparameters_then_names(capsys, tmp_path):
    """`--help`: model, data, rounds and clients described first, then the hyperparameters of --fed_algorithm (at
    that preset's defaults; given before or after --help), then every other field by name only."""
    text = help_text(lambda: main(["train", "--help"]), capsys)
    options = _option_lines(text)
    assert options[:6] == ["--help", "--help-all", "--config", "--model_name", "--model_name_or_path", "--task"]
    assert options.index("--dataset_name") < options.index("--fed_algorithm") < options.index("--num_rounds") \
        < options.index("--num_clients") < options.index("--learning_rate")
    assert "hyperparameters of fedavg" in text and options[-1] == "--server_learning_rate"  # FedAvg's one
    assert "--rho FLOAT" not in text and " --rho " in text  # another algorithm's: by name only
    assert "--adam_beta1" in text and "--adam_beta1 FLOAT" not in text
    assert len(text.splitlines()) < 200
    for argv in (["train", "--fed_algorithm", "fedsam", "--help"], ["train", "--help", "--fed_algorithm=fedsam"]):
        text = help_text(lambda: main(argv), capsys)
        section = text[text.index("hyperparameters of fedsam"):text.index("every other field, by name")]
        assert _option_lines(section) == ["--rho", "--rho_start", "--rho_warmup_rounds", "--server_learning_rate"]
        assert "(default: 0.05)" in " ".join(section[:section.index("--rho_start")].split())
    text = help_text(lambda: main(["train", "--fed_algorithm", "fedgloss", "--help"]), capsys)
    section = " ".join(text[text.index("hyperparameters of fedgloss"):text.index("every other field, by name")].split())
    assert "--fedgloss_rho FLOAT" in section and "--rho_warmup_rounds INT" in section and "(default: 2000)" in section
    config = tmp_path / "run.yaml"  # the config file's algorithm and values, as the run would read them
    config.write_text("fed_algorithm: fedsam\nrho: 0.2\n")
    text = help_text(lambda: main(["train", str(config), "--help"]), capsys)
    section = " ".join(text[text.index("hyperparameters of fedsam"):text.index("every other field, by name")].split())
    assert "--rho FLOAT" in section and "(default: 0.2)" in section
    text = help_text(lambda: main(["train", "--fed_algorithm", "nosuch", "--help"]), capsys)
    assert "unknown algorithm: `hf-fedflat list` names them." in text


def test_train_help_all_lists_federated_fields_before_the_inherited_ones(capsys):
    text = help_text(lambda: main(["train", "--help-all"]), capsys)
    assert text.index("--fed_algorithm") < text.index("--num_clients") < text.index("--adam_beta1")
    assert text.index("federated options") < text.index("data options") < text.index("inherited Trainer options")
    first_inherited = text.index("inherited Trainer options")
    for flag in ("--num_rounds", "--local_epochs", "--rho", "--learning_rate", "--partition_scheme"):
        assert text.index(flag) < first_inherited, flag
    assert text.index("--fed_algorithm") < 30 * 80  # on the first screens
    # every field is listed once: the federated ones (FedTrainingArguments' own fields and the Trainer fields it
    # redeclares) before the inherited Trainer options, every other Trainer field after them
    options = [(m.group(1), m.start()) for m in re.finditer(r"^  --(\w+)", text, flags=re.M)]
    names = [name for name, _ in options]
    assert len(names) == len(set(names)), sorted({name for name in names if names.count(name) > 1})
    at = dict(options)
    ours, theirs = FedTrainingArguments.__dataclass_fields__, TrainingArguments.__dataclass_fields__
    federated = {name for name, f in ours.items() if theirs.get(name) is not f}
    inherited = set(ours) - federated
    assert {"fed_algorithm", "num_rounds", "rho", "learning_rate", "optim"} <= federated and "adam_beta1" in inherited
    assert federated | inherited <= set(at)  # every field has its flag
    misplaced = [name for name in federated if at[name] > first_inherited]
    misplaced += [name for name in inherited if at[name] < first_inherited]
    assert not misplaced, sorted(misplaced)


def test_parse_arguments_refuses_unknown_config_keys_and_recipe_flags(tmp_path):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"num_round": 3}))
    with pytest.raises(ValueError, match=r"^config: unknown field\(s\) num_round in "):
        parse_arguments([FedTrainingArguments], ["--config", str(config)])
    with pytest.raises(ValueError, match="^recipe defaults: '--num_round' is not a flag"):
        parse_arguments([FedTrainingArguments], [], defaults=["--num_round", "3"])
    assert math.isclose(parse_arguments([FedTrainingArguments], ["--output_dir", str(tmp_path)],
                                        defaults=["--weight_decay", "1e-3"])[0].weight_decay, 1e-3)
