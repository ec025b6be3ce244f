"""The scripts of ``recipes/``: each runs end to end with tiny arguments (its ``main()`` called like the CLI would),
takes ``--smoke`` (the text recipes' too, offline), and its ``--help`` shows its docstring and its defaults."""

from __future__ import annotations

import json
import math

import pytest

from helpers import REPO_ROOT, help_text, load_recipe

RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("*.py"))

TINY = ["--num_clients", "6", "--clients_per_round", "3", "--num_rounds", "2", "--use_cpu", "true",
        "--disable_tqdm", "true", "--image_size", "8"]


def test_quickstart_compares_algorithms_into_subfolders(tmp_path):
    quickstart = load_recipe("quickstart")
    rows = quickstart.main(["--output_dir", str(tmp_path), "--compare", "fedavg,fedsam", *TINY])
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedsam"]
    for name in ("fedavg", "fedsam"):
        history = json.loads((tmp_path / name / "history.json").read_text())
        assert len(history) == 2 and 0.0 <= history[-1]["eval_accuracy"] <= 1.0
        assert (tmp_path / name / "final_model" / "model.safetensors").exists()
    table = (tmp_path / "results.md").read_text()
    assert "| fedavg |" in table and "| fedsam |" in table


def test_quickstart_single_algorithm_writes_into_output_dir(tmp_path):
    quickstart = load_recipe("quickstart")
    rows = quickstart.main(["--output_dir", str(tmp_path), "--fed_algorithm", "scaffold", *TINY])
    assert [r["algorithm"] for r in rows] == ["scaffold"]
    assert (tmp_path / "final_model" / "config.json").exists()
    assert json.loads((tmp_path / "final_model" / "federated_config.json").read_text())["algorithm"]["corrections"] == ["scaffold"]


def test_quickstart_reads_a_yaml_config(tmp_path):
    quickstart = load_recipe("quickstart")
    config = tmp_path / "run.yaml"
    config.write_text(
        f"output_dir: {tmp_path / 'out'}\nfed_algorithm: fedgamma\nnum_clients: 6\nclients_per_round: 2\n"
        "num_rounds: 1\nuse_cpu: true\ndisable_tqdm: true\nimage_size: 8\nrho: 0.1\n"
    )
    rows = quickstart.main([str(config)])
    assert rows[0]["algorithm"] == "fedgamma"
    assert (tmp_path / "out" / "history.json").exists()


def test_compare_algorithms_writes_table_csv_and_curves(tmp_path):
    compare = load_recipe("compare_algorithms")
    rows = compare.main(["--output_dir", str(tmp_path), "--algorithms", "fedavg,fedlesam,fedadam+fedgh",
                         "--target_accuracy", "0.05", *TINY])
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedlesam", "fedadam+fedgh"]
    assert rows[0]["time_vs_fedavg"] == 1.0 and [r["passes_per_step"] for r in rows] == [1, 1, 1]
    assert all(r["rounds_to_target"] == 1 for r in rows)  # any model beats 5% on 10 classes
    fedavg_history = json.loads((tmp_path / "fedavg" / "history.json").read_text())
    assert rows[0]["megabytes_per_round"] == (fedavg_history[0]["bytes_up"] + fedavg_history[0]["bytes_down"]) / 1e6
    # FedAdam ran with its preset's server lr (0.1), not FedAvg's 1.0
    assert json.loads((tmp_path / "fedadam_fedgh" / "history.json").read_text())
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("algorithm,final_accuracy,best_accuracy") and len(csv_lines) == 4
    assert "| fedadam+fedgh |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "accuracy_curves.png").read_bytes()[:4] == b"\x89PNG"


SMOKE_RECIPES = ["officehome_lesam", "domainnet_lesam", "cifar_dirichlet", "mnist_fedgam", "shakespeare_fedup",
                 "cifar_dfedgam"]


def test_each_recipe_smoke_mode_runs_end_to_end(tmp_path):
    for name in SMOKE_RECIPES:
        out = tmp_path / name
        experiment, output = load_recipe(name).main(["--smoke", "--output_dir", str(out), "--disable_tqdm", "true"])
        assert [r["round"] for r in output.history] == [1, 2], name
        assert 0.0 <= output.history[-1]["eval_accuracy"] <= 1.0
        card = (out / "final_model" / "README.md").read_text()
        assert "federated-learning" in card and experiment.data.name in card
        assert (out / "checkpoints" / "round-2").is_dir()
        partition = json.loads((out / "partition.json").read_text())
        if name.endswith("_lesam"):  # leave-one-domain-out: the held-out domain is in no client
            held_out = experiment.data_args.held_out_domain
            assert held_out not in partition["client_domains"] and experiment.args.num_clients == len(
                partition["client_domains"])
            test_domains = set(experiment.data.eval.with_format(None)["domain"])
            assert len(test_domains) == 1
        if name == "shakespeare_fedup":
            assert experiment.args.num_clients == 6  # one client per (play, role), from the data
        if name == "cifar_dfedgam":  # gossip, no server: the decentralized metrics are logged
            assert {"consensus_distance", "spectral_gap", "local_eval_accuracy_mean"} <= set(output.history[-1])


def test_lora_recipe_sends_only_adapters_and_head(tmp_path):
    experiment, output = load_recipe("officehome_lesam").main(
        ["--smoke", "--output_dir", str(tmp_path), "--use_lora", "true", "--lora_r", "2", "--disable_tqdm", "true"])
    from hf_fedflat.models.lora import total_parameter_bytes, trainable_parameter_bytes

    model = experiment.trainer.model
    sampled = output.history[0]["num_clients"]
    assert output.history[0]["bytes_up"] == sampled * trainable_parameter_bytes(model)
    assert trainable_parameter_bytes(model) < 0.5 * total_parameter_bytes(model)
    names = [n for n in experiment.trainer.space.names]
    assert names and all("lora_" in n or "head" in n for n in names)
    # merged by default: a plain model that loads without peft
    from hf_fedflat.models import load_model

    assert load_model(str(tmp_path / "final_model")) is not None


def test_recipes_say_what_to_pass_when_the_hub_is_unreachable(tmp_path):
    from hf_fedflat.data import DatasetUnavailableError

    with pytest.raises(DatasetUnavailableError, match="data_dir"):
        load_recipe("officehome_lesam").main(["--output_dir", str(tmp_path), "--use_cpu", "true"])
    with pytest.raises(ValueError, match="^data_dir: DomainNet has no canonical Hub copy"):
        load_recipe("domainnet_lesam").main(["--output_dir", str(tmp_path), "--use_cpu", "true"])


def test_quickstart_runs_a_decentralized_algorithm(tmp_path):
    rows = load_recipe("quickstart").main(["--output_dir", str(tmp_path), "--fed_algorithm", "dfedgam",
                                           "--topology", "ring", *TINY])
    assert rows[0]["algorithm"] == "dfedgam"
    history = json.loads((tmp_path / "history.json").read_text())
    assert "consensus_distance" in history[-1]


def test_quickstart_and_compare_algorithms_take_smoke(tmp_path):
    """`accelerate launch recipes/quickstart.py --smoke` (and compare_algorithms.py): seconds, offline."""
    rows = load_recipe("quickstart").main(["--smoke", "--output_dir", str(tmp_path / "quick")])
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedsam"]
    for name in ("fedavg", "fedsam"):
        history = json.loads((tmp_path / "quick" / name / "history.json").read_text())
        assert [r["round"] for r in history] == [1, 2] and history[0]["num_clients"] == 2
    rows = load_recipe("compare_algorithms").main(["--smoke", "--output_dir", str(tmp_path / "compare")])
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedlesam"]
    assert (tmp_path / "compare" / "results.md").exists()




def test_text_recipes_smoke_offline(tmp_path, one_thread, capsys):
    """`recipes/llm_lora.py --smoke` and `recipes/text_classification.py --smoke`: a tiny model, tokenizer and data
    in the real formats written under <output_dir>/smoke_assets, 2 rounds, the metrics of each task."""
    experiment, output = load_recipe("llm_lora").main(["--smoke", "--output_dir", str(tmp_path / "llm"),
                                                        "--disable_tqdm", "true"])
    assert [r["round"] for r in output.history] == [1, 2]
    last = output.history[-1]
    assert last["eval_perplexity"] == pytest.approx(math.exp(last["eval_token_loss"]), rel=1e-9)
    assert experiment.data.task == "causal-lm" and (tmp_path / "llm" / "smoke_assets" / "data" / "alpaca_data.json").is_file()
    names = experiment.trainer.space.names
    assert names and all("lora_" in n for n in names)  # only the adapters are federated
    # the end-of-run line reports what the card ranks by: a causal LM's perplexity (it has no accuracy)
    assert f"final perplexity {last['eval_perplexity']:.4f}; model and card in" in capsys.readouterr().out
    experiment, output = load_recipe("text_classification").main(
        ["--smoke", "--output_dir", str(tmp_path / "cls"), "--disable_tqdm", "true"])
    assert [r["round"] for r in output.history] == [1, 2] and 0.0 <= output.history[-1]["eval_accuracy"] <= 1.0
    assert experiment.data.label_names == ["neg", "pos"] and experiment.data.partition is None
    assert experiment.args.partition_scheme == "dirichlet"


def test_token_classification_recipe_smoke_offline(tmp_path, one_thread, capsys):
    """`recipes/token_classification.py --smoke`: a tiny BERT token classifier, a WordPiece tokenizer and CoNLL files
    written under <output_dir>/smoke_assets, 2 rounds, entity-level metrics in the history."""
    experiment, output = load_recipe("token_classification").main(
        ["--smoke", "--output_dir", str(tmp_path), "--disable_tqdm", "true"])
    assert [r["round"] for r in output.history] == [1, 2]
    last = output.history[-1]
    assert all(0.0 <= last[f"eval_{k}"] <= 1.0 for k in ("f1", "precision", "recall", "accuracy"))
    assert f"final f1 {last['eval_f1']:.4f}; model and card in" in capsys.readouterr().out  # entity F1, as the card
    assert experiment.data.task == "token-classification" and experiment.data.label_names[0] == "O"
    assert (tmp_path / "smoke_assets" / "conll" / "train.txt").is_file()
    config = json.loads((tmp_path / "final_model" / "config.json").read_text())
    assert config["id2label"]["0"] == "O" and config["architectures"] == ["BertForTokenClassification"]


# --- --help and --smoke of every recipe ------------------------------------------------------------------------
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


# --- every shipped config file learns ------------------------------------------------------------------------
#: config -> (the reduction a test can afford, stated; the final accuracy it must reach: 10 classes, chance 0.1).
#: The shipped settings otherwise: model, optimizer, learning rate, batch size, algorithm and its hyperparameters.
CONFIG_REDUCTIONS = {
    "quickstart_fedavg": (["--num_rounds", "10"], 0.5),                         # 30 rounds shipped
    "quickstart_fedsam": (["--num_rounds", "10"], 0.5),                         # 30 rounds shipped
    "digits_fedlesam": (["--num_rounds", "10", "--num_clients", "20"], 0.4),    # 200 rounds of 100 clients shipped
    # 30 rounds of 20 Dir(0.3) clients x 2 epochs shipped (0.736, measured in the file); here 6 rounds of 4 IID
    # clients x 1 epoch (0.35 measured)
    "digits_vit_fedsam": (["--num_rounds", "6", "--num_clients", "4", "--clients_per_round", "4",
                           "--partition_scheme", "iid", "--local_epochs", "1"], 0.25),
}


def test_every_shipped_config_has_a_reduction():
    assert sorted(CONFIG_REDUCTIONS) == sorted(p.stem for p in (REPO_ROOT / "recipes" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(CONFIG_REDUCTIONS))
def test_every_shipped_config_learns(name, tmp_path, one_thread):
    """`hf-fedflat train recipes/configs/<name>.yaml` with the reduction above (the file first, the flags after it
    win): the final accuracy is well above chance."""
    from hf_fedflat.cli import main

    reduction, threshold = CONFIG_REDUCTIONS[name]
    config = str(REPO_ROOT / "recipes" / "configs" / f"{name}.yaml")
    assert main(["train", config, *reduction, "--output_dir", str(tmp_path), "--report_to", "none",
                 "--save_every_n_rounds", "0", "--disable_tqdm", "true", "--use_cpu", "true"]) == 0
    history = json.loads((tmp_path / "history.json").read_text())
    accuracies = [round(r.get("eval_accuracy", 0), 3) for r in history]
    assert history[-1]["eval_accuracy"] >= threshold, accuracies
