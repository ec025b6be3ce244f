"""``--do_eval`` / ``--do_predict`` through ``hf-fedflat train``: the final model's evaluation in
``eval_results.json`` and its predictions on the held-out split in ``predict_results.json`` / ``predictions.json``,
checked against the history's last evaluation and recomputed from the written predictions; without the flags
nothing is written, and a run without a held-out split is refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import datasets
import numpy as np
import pytest

from hf_fedflat.cli import main
from hf_fedflat.cli.final_evaluation import check_final_evaluation
from hf_fedflat.data.tiny_text import write_sentiment_data, write_tiny_model
from hf_fedflat.field_checks import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("final_evaluation")
    return {"bert": write_tiny_model(root / "bert", "bert"),
            "sentiment": write_sentiment_data(root / "sentiment", train_rows=60, test_rows=24)}


def run(assets, out, *extra) -> list[dict]:
    argv = ["train", "--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"],
            "--output_dir", str(out), "--num_clients", "2", "--clients_per_round", "2", "--num_rounds", "2",
            "--local_steps", "2", "--learning_rate", "1e-3", "--use_cpu", "true", "--report_to", "none",
            "--disable_tqdm", "true", *extra]
    assert main(argv) == 0
    return json.loads((out / "history.json").read_text())


def test_do_eval_and_do_predict_write_the_final_models_results(assets, tmp_path, capsys):
    history = run(assets, tmp_path, "--do_eval", "--do_predict")
    last = history[-1]
    assert all("eval_accuracy" in record for record in history)  # per-round evaluation as eval_every_n_rounds says
    evaluated = json.loads((tmp_path / "eval_results.json").read_text())
    assert evaluated["eval_accuracy"] == pytest.approx(last["eval_accuracy"], abs=1e-12)  # the same final model
    assert evaluated["eval_loss"] == pytest.approx(last["eval_loss"], rel=1e-6)
    assert evaluated["round"] == 2 and "epoch" not in evaluated
    predicted = json.loads((tmp_path / "predict_results.json").read_text())
    assert predicted["test_accuracy"] == pytest.approx(last["eval_accuracy"], abs=1e-12)
    assert predicted["round"] == 2 and "epoch" not in predicted
    rows = json.loads((tmp_path / "predictions.json").read_text())
    test = datasets.load_from_disk(assets["sentiment"])["test"]
    assert rows["task"] == "text-classification" and rows["label_names"] == ["neg", "pos"]
    assert rows["label_ids"] == list(test["label"])  # in the split's order
    assert len(rows["predictions"]) == 24 and set(rows["predictions"]) <= {0, 1}
    hits = np.mean(np.asarray(rows["predictions"]) == np.asarray(rows["label_ids"]))
    assert float(hits) == pytest.approx(predicted["test_accuracy"], abs=1e-12)
    out = capsys.readouterr().out
    assert "***** eval metrics *****" in out and "***** predict metrics *****" in out  # as the Trainer's scripts


def test_do_predict_writes_the_tags_of_a_token_classifier(tmp_path):
    """Token classification: the logits reach the predictions already reduced to tag ids; predictions.json holds
    each labelled token's predicted tag, and their token accuracy is the run's."""
    from hf_fedflat.data.tiny_text import train_wordpiece_tokenizer, write_conll_data

    model = write_tiny_model(tmp_path / "ner", "bert_token_classification", num_labels=7,
                             tokenizer=train_wordpiece_tokenizer())
    conll = write_conll_data(tmp_path / "conll", train_sentences=24, test_sentences=8)
    argv = ["train", "--model_name_or_path", model, "--dataset_name", conll, "--output_dir", str(tmp_path / "run"),
            "--num_clients", "2", "--num_rounds", "1", "--local_steps", "2", "--use_cpu", "true",
            "--report_to", "none", "--disable_tqdm", "true", "--do_predict"]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "run" / "predictions.json").read_text())
    predicted = json.loads((tmp_path / "run" / "predict_results.json").read_text())
    assert rows["task"] == "token-classification" and rows["label_names"][0] == "O"
    assert len(rows["predictions"]) == 8 and [len(p) for p in rows["predictions"]] == [len(t) for t in rows["label_ids"]]
    tokens = [(p, t) for ps, ts in zip(rows["predictions"], rows["label_ids"]) for p, t in zip(ps, ts)]
    assert np.mean([p == t for p, t in tokens]) == pytest.approx(predicted["test_accuracy"], abs=1e-12)


def test_without_the_flags_nothing_more_is_written(assets, tmp_path):
    run(assets, tmp_path)
    for name in ("eval_results.json", "predict_results.json", "predictions.json"):
        assert not (tmp_path / name).exists()


@pytest.mark.parametrize("field", ["do_eval", "do_predict"])
def test_a_run_without_a_held_out_split_is_refused(field):
    args = SimpleNamespace(**{"do_eval": False, "do_predict": False, field: True})
    with pytest.raises(ConfigError, match=f"^{field}: the tiny data has no held-out split"):
        check_final_evaluation(args, SimpleNamespace(eval=None, name="tiny"))
    check_final_evaluation(args, SimpleNamespace(eval=[1], name="tiny"))  # with one: accepted
