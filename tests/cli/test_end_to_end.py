"""``hf-fedflat train --model_name_or_path <dir> --dataset_name <data>`` end to end, offline, on tiny models.

BERT-style sequence classification and GPT-2 / Llama-style causal LMs, each with and without LoRA, trained two
rounds through the CLI (in process; one case in a subprocess). The final model reloads with the Auto classes and
``pipeline``, and the run's last evaluation is recomputed here from the reloaded model and the raw data:
accuracy from ``pipeline`` predictions, the causal LM's token loss / perplexity / token accuracy from per-row
forward passes. Plus the data side through the command line: natural-id partitions, IID without a label column,
label encoding, errors. (The partitions themselves are tested in ``tests/data/test_partition.py``, the text
recipes' ``--smoke`` in ``tests/cli/test_recipes.py``.)
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import datasets
import numpy as np
import pytest
import torch

from hf_fedflat.cli import main
from hf_fedflat.data.partition import ClientPartition
from hf_fedflat.data.tiny_text import write_instruction_data, write_sentiment_data, write_tiny_model

SEED = 42
COMMON = ["--num_rounds", "2", "--clients_per_round", "2", "--local_steps", "3", "--optim", "adamw_torch",
          "--learning_rate", "0.01", "--per_device_train_batch_size", "8", "--use_cpu", "true", "--seed", str(SEED),
          "--save_every_n_rounds", "0", "--report_to", "none"]
LORA = ["--use_lora", "true", "--lora_r", "4", "--lora_alpha", "8"]

# Alpaca's templates written out here (not imported), so the recomputed loss checks the data code too
PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one intra-op thread


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_assets")
    return {
        "bert": write_tiny_model(root / "bert", "bert"),
        "gpt2": write_tiny_model(root / "gpt2", "gpt2"),
        "llama": write_tiny_model(root / "llama", "llama"),
        "sentiment": write_sentiment_data(root / "sentiment", train_rows=60, test_rows=20),
        "sentiment_csv": write_sentiment_data(root / "sentiment_csv", train_rows=40, test_rows=12, fmt="csv"),
        "alpaca": write_instruction_data(root / "alpaca", rows=50),
    }


def _train(argv, output_dir, subprocess_run=False):
    argv = ["train", *argv, "--output_dir", str(output_dir), *COMMON]
    if subprocess_run:
        result = subprocess.run([sys.executable, "-m", "hf_fedflat.cli", *argv], capture_output=True, text=True,
                                timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        assert main(argv) == 0
    history = json.loads((output_dir / "history.json").read_text())
    assert len(history) == 2
    return history[-1], output_dir / "final_model"


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_bert_classifier_end_to_end_reloads_with_pipeline(assets, tmp_path, lora):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    last, final = _train(["--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"],
                          "--partition_by", "user_id", *(LORA if lora else [])], tmp_path)
    model = AutoModelForSequenceClassification.from_pretrained(final)
    assert model.config.id2label == {0: "neg", 1: "pos"}  # the ClassLabel's names
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(assets["bert"]).get_vocab()
    if lora:
        assert not any("lora" in name for name in model.state_dict())  # merged into the base weights
    test = datasets.load_from_disk(assets["sentiment"])["test"]
    classify = pipeline("text-classification", model=str(final), device="cpu")
    predicted = [p["label"] for p in classify(list(test["text"]))]
    truth = [test.features["label"].int2str(int(v)) for v in test["label"]]
    accuracy = float(np.mean([p == t for p, t in zip(predicted, truth)]))
    assert accuracy == pytest.approx(last["eval_accuracy"], abs=1e-9)
    # the loss too, recomputed from the reloaded weights on the whole test split in one batch
    batch = tokenizer(list(test["text"]), padding=True, return_tensors="pt")
    with torch.no_grad():
        loss = model(**batch, labels=torch.tensor(test["label"])).loss
    assert float(loss) == pytest.approx(last["eval_loss"], rel=1e-4)
    # natural-id partition: one client per user, complete and disjoint, every client's rows one user's
    part = ClientPartition.load_json(tmp_path / "partition.json")
    users = datasets.load_from_disk(assets["sentiment"])["train"]["user_id"]
    assert part.scheme == "natural_id" and part.num_clients == len(set(users))
    rows = np.concatenate(part.client_indices)
    np.testing.assert_array_equal(np.sort(rows), np.arange(len(users)))
    groups = [{users[i] for i in idx} for idx in part.client_indices]
    assert all(len(g) == 1 for g in groups) and sorted(g.pop() for g in groups) == sorted(set(users))
    card = (final / "README.md").read_text()
    assert "natural_id" in card



@pytest.mark.parametrize("algorithm", ["fedasam", "fedwmsam", "fedgmt", "fedgloss"])
def test_newer_methods_train_a_bert_classifier_whose_final_model_reproduces_its_loss(assets, tmp_path, algorithm):
    """The newer flatness methods on a transformers text classifier: ASAM's weight mask over BERT's names, FedWMSAM's
    momentum, FedGMT's second forward, FedGloSS's sent weights; the reloaded final model gives the last eval_loss."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    argv = ["train", "--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"],
            "--fed_algorithm", algorithm, "--num_clients", "4", "--output_dir", str(tmp_path), *COMMON, "--optim", "sgd",
            "--learning_rate", "0.05"]
    assert main(argv) == 0
    history = json.loads((tmp_path / "history.json").read_text())
    assert len(history) == 2 and all(math.isfinite(r["eval_loss"]) for r in history)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "final_model").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "final_model")
    test = datasets.load_from_disk(assets["sentiment"])["test"]
    batch = tokenizer(list(test["text"]), padding=True, return_tensors="pt")
    with torch.no_grad():
        loss = model(**batch, labels=torch.tensor(test["label"])).loss
    assert float(loss) == pytest.approx(history[-1]["eval_loss"], rel=1e-4)
    initial = AutoModelForSequenceClassification.from_pretrained(assets["bert"], num_labels=2)
    moved = [name for name, value in model.state_dict().items()
             if name in initial.state_dict() and not torch.equal(value, initial.state_dict()[name])]
    assert any("encoder" in name for name in moved)  # the body trained, not only the new head

def _alpaca_eval_rows(path):
    """The evaluation rows the run held out: 0.2 of the single split, seed 42 (as --test_fraction says)."""
    raw = datasets.load_dataset("json", data_files={"train": path})["train"]
    return list(raw.train_test_split(test_size=0.2, seed=SEED)["test"])


def _response_statistics(model, tokenizer, rows):
    """Summed NLL, count and argmax hits over the response tokens (+ EOS), one row at a time, no padding."""
    nll, count, hits = 0.0, 0, 0
    for row in rows:
        template = PROMPT_INPUT if row["input"] else PROMPT_NO_INPUT
        prompt = tokenizer(template.format(**row))["input_ids"]
        response = tokenizer(row["output"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        for t in range(len(prompt), ids.shape[1]):  # token t predicted from position t - 1
            nll -= float(logp[t - 1, ids[0, t]])
            hits += int(int(logits[t - 1].argmax()) == int(ids[0, t]))
            count += 1
    return nll, count, hits


@pytest.mark.parametrize("arch,lora,in_subprocess", [("gpt2", False, False), ("llama", True, False),
                                                      ("llama", False, True), ("gpt2", True, False)],
                         ids=["gpt2-full", "llama-lora", "llama-full-subprocess", "gpt2-lora"])
def test_causal_lm_end_to_end_perplexity_reproduced(assets, tmp_path, arch, lora, in_subprocess):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    # GPT-2 leaves the partition scheme to its default: iid for a causal LM's rows (no class to split by)
    last, final = _train(["--model_name_or_path", assets[arch], "--dataset_name", assets["alpaca"],
                          "--num_clients", "3", *(["--partition_scheme", "iid"] if arch == "llama" else []),
                          "--max_seq_length", "64", *(LORA if lora else [])], tmp_path, subprocess_run=in_subprocess)
    assert ClientPartition.load_json(tmp_path / "partition.json").scheme == "iid"
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(assets[arch]).get_vocab()
    nll, count, hits = _response_statistics(model, tokenizer, _alpaca_eval_rows(assets["alpaca"]))
    assert last["eval_tokens"] == count
    assert last["eval_token_loss"] == pytest.approx(nll / count, rel=1e-4)
    assert last["eval_perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert last["eval_token_accuracy"] == pytest.approx(hits / count, abs=1e-9)
    # the 10 evaluation rows fit one batch: the Trainer's eval_loss is then the same token mean
    assert last["eval_loss"] == pytest.approx(nll / count, rel=1e-4)
    assert "eval_accuracy" not in last  # no unshifted, unmasked "accuracy" for a language model
    generate = pipeline("text-generation", model=str(final), device="cpu")
    out = generate(PROMPT_NO_INPUT.format(instruction="Repeat the colours ."), max_new_tokens=3, do_sample=False)
    assert out[0]["generated_text"].startswith(PROMPT_NO_INPUT.format(instruction="Repeat the colours .")[:20])


def test_csv_string_labels_encoded_and_iid_without_label_column(assets, tmp_path):
    from transformers import AutoModelForSequenceClassification

    last, final = _train(["--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment_csv"],
                          "--num_clients", "3", "--partition_scheme", "iid"], tmp_path)
    model = AutoModelForSequenceClassification.from_pretrained(final)
    assert model.config.id2label == {0: "neg", 1: "pos"}  # string labels, sorted names
    assert 0.0 <= last["eval_accuracy"] <= 1.0


def test_bad_dataset_arguments_are_named(assets, tmp_path, capsys):
    """Each is one line naming the field and exit status 2 (tests/cli/test_input_errors.py has the other refusals)."""
    cases = [
        (["--dataset_name", assets["sentiment"]], "not a registered dataset.*--model_name_or_path"),
        (["--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"], "--text_column", "body"],
         "text_column: 'body' not a column"),
        (["--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"], "--partition_by", "speaker"],
         "partition_by: 'speaker' is not a column"),
        (["--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"], "--eval_split", "dev"],
         "eval_split: no split 'dev'"),
        (["--model_name_or_path", assets["bert"], "--dataset_name", "no-such-user/no-such-data"],
         "dataset_name: cannot load the Hub dataset 'no-such-user/no-such-data'"),
        (["--dataset_name", "digits", "--partition_by", "label"], "partition_by: applies to Hub/local datasets"),
    ]
    for index, (flags, message) in enumerate(cases):
        out = tmp_path / str(index)
        assert main(["train", *flags, "--output_dir", str(out), *COMMON]) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(message, err[0]) and "Traceback" not in err[0], (flags, err)
    # found once the data is read (after its progress bars): a class partition of a causal LM's token labels
    flags = ["--model_name_or_path", assets["gpt2"], "--dataset_name", assets["alpaca"], "--num_clients", "4",
             "--partition_scheme", "dirichlet"]
    assert main(["train", *flags, "--output_dir", str(tmp_path / "lm"), *COMMON]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.match(
        "hf-fedflat train: error: partition_scheme: it splits the rows by class, but label_column='labels' holds a "
        "sequence", err.strip().splitlines()[-1])


# --- --metrics, generations, token classification ------------------------------------------------------------------
def _event_tags(output_dir):
    """Scalar and tensor (text) tags of the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars, tensors = set(), set()
    for events in output_dir.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        scalars |= set(accumulator.Tags()["scalars"])
        tensors |= set(accumulator.Tags()["tensors"])
    return scalars, tensors


def test_chosen_classification_metrics_equal_sklearn_and_reach_history_and_tensorboard(assets, tmp_path):
    from sklearn.metrics import f1_score, matthews_corrcoef
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    argv = ["--model_name_or_path", assets["bert"], "--dataset_name", assets["sentiment"], "--num_clients", "3",
            "--partition_scheme", "iid", "--metrics", "accuracy,f1,matthews"]
    assert main(["train", *argv, "--output_dir", str(tmp_path), *COMMON, "--local_steps", "8"]) == 0
    last, final = json.loads((tmp_path / "history.json").read_text())[-1], tmp_path / "final_model"
    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    test = datasets.load_from_disk(assets["sentiment"])["test"]
    with torch.no_grad():
        predicted = [int(model(**tokenizer(text, return_tensors="pt")).logits.argmax()) for text in test["text"]]
    labels = list(test["label"])
    assert last["eval_accuracy"] == pytest.approx(np.mean(np.array(predicted) == labels), abs=1e-9)
    assert last["eval_f1_macro"] == pytest.approx(f1_score(labels, predicted, average="macro"), abs=1e-9)
    assert last["eval_f1_micro"] == pytest.approx(f1_score(labels, predicted, average="micro"), abs=1e-9)
    assert last["eval_f1"] == pytest.approx(f1_score(labels, predicted), abs=1e-9)  # two classes: binary, of "pos"
    assert last["eval_matthews"] == pytest.approx(matthews_corrcoef(labels, predicted), abs=1e-9)
    assert len(set(predicted)) == 2  # both classes predicted: the scores are not a constant guess's
    assert "eval_precision_macro" not in last and "eval_recall_micro" not in last  # only what was chosen
    out = tmp_path / "tb"
    assert main(["train", *argv, "--output_dir", str(out), *COMMON[:-2], "--report_to", "tensorboard"]) == 0
    scalars, _ = _event_tags(out)
    assert {"eval/f1_macro", "eval/f1_micro", "eval/matthews", "eval/accuracy"} <= scalars  # (eval_x as eval/x)


def _greedy(model, tokenizer, prompt: str, steps: int) -> str:
    """Greedy continuation written out: the argmax token appended, one forward pass each, stopping at EOS."""
    ids = tokenizer(prompt)["input_ids"]
    new = []
    with torch.no_grad():
        for _ in range(steps):
            next_id = int(model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
            if next_id == tokenizer.eos_token_id:
                break
            new.append(next_id)
    return tokenizer.decode(new, skip_special_tokens=True)


def test_causal_lm_chosen_metrics_and_generations_in_history_and_tensorboard(assets, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = [PROMPT_NO_INPUT.format(instruction="Repeat the colours ."), "the movie was"]
    assert main(["train", "--model_name_or_path", assets["gpt2"], "--dataset_name", assets["alpaca"], "--num_clients",
                 "3", "--partition_scheme", "iid", "--max_seq_length", "64", "--metrics", "perplexity",
                 "--generation_prompts", *prompts, "--generation_max_new_tokens", "4", "--output_dir", str(tmp_path),
                 *COMMON[:-2], "--report_to", "tensorboard"]) == 0
    history = json.loads((tmp_path / "history.json").read_text())
    last, final = history[-1], tmp_path / "final_model"
    assert {k for k in last if k.startswith("eval_")} == {"eval_loss", "eval_perplexity", "eval_tokens"} | {
        k for k in last if k.startswith("eval_") and k.endswith("_time")}  # the Trainer's own timing aside
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    nll, count, _ = _response_statistics(model, tokenizer, _alpaca_eval_rows(assets["alpaca"]))
    assert last["eval_perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert all([g["prompt"] for g in record["generations"]] == prompts for record in history)
    assert [g["completion"] for g in last["generations"]] == [_greedy(model, tokenizer, p, 4) for p in prompts]
    _, tensors = _event_tags(tmp_path)
    assert any("generations" in tag for tag in tensors)


def test_token_classification_end_to_end_entity_f1_reproduced(tmp_path, capsys):
    from seqeval.metrics import f1_score
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from hf_fedflat.data.ner import read_conll
    from hf_fedflat.data.tiny_text import train_wordpiece_tokenizer, write_conll_data

    model_dir = write_tiny_model(tmp_path / "ner_model", "bert_token_classification", num_labels=7,
                                 tokenizer=train_wordpiece_tokenizer())
    conll = write_conll_data(tmp_path / "conll", train_sentences=60, test_sentences=16)
    last, final = _train(["--model_name_or_path", model_dir, "--dataset_name", conll, "--num_clients", "3",
                          "--partition_scheme", "dirichlet", "--dirichlet_alpha", "1.0"], tmp_path / "run")
    model = AutoModelForTokenClassification.from_pretrained(final).eval()
    assert model.config.id2label == dict(enumerate(["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"]))
    tokenizer = AutoTokenizer.from_pretrained(final)
    truth, predicted = [], []
    for sentence in read_conll(str(tmp_path / "conll" / "test.txt")):
        encoded = tokenizer(sentence["tokens"], is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            ids = model(**encoded).logits[0].argmax(-1).tolist()
        word_ids = encoded.word_ids(0)
        first = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
        predicted.append([model.config.id2label[ids[i]] for i in first])
        truth.append(sentence["ner_tags"])
    assert last["eval_f1"] == pytest.approx(f1_score(truth, predicted), abs=1e-9)
    # the end-of-run table headlines entity F1, as the model card ranks by it (not token accuracy)
    assert f"| final eval_f1 |" in capsys.readouterr().out
    assert {"eval_precision", "eval_recall", "eval_accuracy"} <= set(last)
    part = json.loads((tmp_path / "run" / "partition.json").read_text())
    assert part["scheme"] == "dirichlet"


def test_metrics_refused_before_the_data_loads(assets, tmp_path, capsys):
    """A metric the task has not, or an unknown one, is one line naming metrics and exit 2; the dataset (a Hub id
    that cannot load here) is never read."""
    cases = [
        (["--model_name_or_path", assets["bert"], "--metrics", "perplexity"],
         r"error: metrics: 'perplexity' does not apply to text-classification"),
        (["--model_name_or_path", assets["gpt2"], "--metrics", "accuracy"], r"error: metrics: 'accuracy' does not apply to causal-lm"),
        (["--model_name_or_path", assets["bert"], "--metrics", "bleu"], r"error: metrics: unknown 'bleu'"),
        (["--model_name_or_path", assets["bert"], "--generation_prompts", "hello"], r"error: generation_prompts: "),
    ]
    for index, (flags, message) in enumerate(cases):
        out = tmp_path / str(index)
        assert main(["train", *flags, "--dataset_name", "no-such-user/no-such-data", "--output_dir", str(out),
                     *COMMON]) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(message, err[0]), (flags, err)
