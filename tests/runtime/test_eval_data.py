"""Evaluation sets read once (``hf_fedflat.runtime.eval_data``, mechanism ``eval_rows``): the fast Trainer's
``evaluate`` / ``predict`` / ``full_gradient`` give what ``transformers.Trainer`` gives on the same weights, value for
value, for an image classifier, a padded text classifier, a causal LM, and images with an on-the-fly transform; the
Trainer's own path where the fast form does not apply; a new or changed dataset is read again."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from transformers import (
    AutoModelForCausalLM, AutoModelForSequenceClassification, DataCollatorForSeq2Seq, DataCollatorWithPadding,
    Trainer, TrainingArguments, default_data_collator,
)

from hf_fedflat.metrics import accuracy_metrics
from hf_fedflat.metrics.language_modeling import causal_lm_metrics, token_statistics
from hf_fedflat.models import create_model
from hf_fedflat.runtime import fast_path
from hf_fedflat.runtime.eval_data import RecordedBatches, mark_deterministic
from hf_fedflat.runtime.fast_trainer import FastClientTrainer
from hf_fedflat.runtime.materialize import TensorRows
from hf_fedflat.runtime.transform_rows import TransformedRows
from hf_fedflat.training.client_trainer import ClientTrainer

from helpers.hf_fixtures import CORPUS, tiny_bert_dir, tiny_gpt2_dir

#: entries of Trainer.evaluate that time the run rather than measure the model
TIMINGS = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


@pytest.fixture(autouse=True)
def fast_path_on():
    """The fast Trainers here are built with the fast path on, whatever HF_FEDFLAT_FAST_PATH says."""
    with fast_path(True):
        yield


def arguments(tmp_path, **overrides) -> TrainingArguments:
    values = dict(output_dir=str(tmp_path / "out"), per_device_eval_batch_size=64, use_cpu=True, report_to="none",
                  disable_tqdm=True)
    values.update(overrides)
    return TrainingArguments(**values)


def measured(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.endswith(TIMINGS)}


def loaded_rows(trainer, dataset):
    """The dataset the evaluation dataloader of ``trainer`` reads ``dataset`` through."""
    return trainer.get_eval_dataloader(dataset).dataset


def assert_same_evaluation(fast, reference, dataset, prefix="eval"):
    """``evaluate`` and ``predict``: the same keys, the same numbers bit for bit."""
    got, expected = fast.evaluate(dataset, metric_key_prefix=prefix), reference.evaluate(dataset, metric_key_prefix=prefix)
    assert set(got) == set(expected)
    assert measured(got) == measured(expected)
    got, expected = fast.predict(dataset), reference.predict(dataset)
    for a, b in ((got.predictions, expected.predictions), (got.label_ids, expected.label_ids)):
        a, b = (a[0], b[0]) if isinstance(a, tuple) else (a, b)
        assert a.shape == b.shape and np.array_equal(a, b)
    assert measured(got.metrics) == measured(expected.metrics)


# --- an image classifier: fixed-shape columns, read from Arrow once ------------------------------------------------
def digits(fmt="torch", rows=None) -> datasets.Dataset:
    data = load_digits()
    x, y = (data.images / 16.0).astype(np.float32)[:, None], data.target.astype(np.int64)
    if rows is not None:
        x, y = x[rows], y[rows]
    dataset = datasets.Dataset.from_dict({"pixel_values": x.tolist(), "labels": y.tolist()})
    dataset.set_format(fmt)
    return dataset


def digits_cnn():
    torch.manual_seed(0)
    return create_model("small_cnn", num_classes=10, in_chans=1, image_size=8, conv_channels=(8, 16), hidden_dim=48,
                        kernel_size=3)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_image_classifier_equals_the_trainer(tmp_path, one_thread, label_smoothing):
    args = arguments(tmp_path, label_smoothing_factor=label_smoothing)  # 1,797 rows: the last batch has 5
    model, dataset = digits_cnn(), digits()
    fast = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, compute_metrics=accuracy_metrics)
    assert isinstance(loaded_rows(fast, dataset), TensorRows)
    assert_same_evaluation(fast, reference, dataset)
    assert_same_evaluation(fast, reference, dataset)  # the second evaluation reads the kept rows


def test_full_gradient_equals_the_reference(tmp_path, one_thread):
    args = arguments(tmp_path)
    model, dataset = digits_cnn(), digits(rows=slice(0, 300))
    fast, reference = FastClientTrainer(model=model, args=args), ClientTrainer(model=model, args=args)
    assert isinstance(loaded_rows(fast, dataset), TensorRows)
    assert torch.equal(fast.full_gradient(dataset), reference.full_gradient(dataset))


def test_a_new_or_changed_dataset_is_read_again(tmp_path, one_thread):
    args = arguments(tmp_path)
    model = digits_cnn()
    fast = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, compute_metrics=accuracy_metrics)
    first, other = digits(rows=slice(0, 200)), digits(rows=slice(200, 400))
    assert fast.evaluate(first) != fast.evaluate(other)
    assert measured(fast.evaluate(other)) == measured(reference.evaluate(other))
    kept = loaded_rows(fast, first)
    first.set_format("numpy")  # an in-place change moves the fingerprint: read again
    assert loaded_rows(fast, first) is not kept
    assert measured(fast.evaluate(first)) == measured(reference.evaluate(first))


def test_switch_off_takes_the_trainers_path(tmp_path, one_thread):
    args = arguments(tmp_path)
    with fast_path(False, without=()):
        off = FastClientTrainer(model=digits_cnn(), args=args)
    with fast_path(True, without=["eval_rows"]):
        without = FastClientTrainer(model=digits_cnn(), args=args)
    dataset = digits(rows=slice(0, 100))
    assert isinstance(loaded_rows(off, dataset), datasets.Dataset)
    assert isinstance(loaded_rows(without, dataset), datasets.Dataset)


# --- a text classifier: per-batch padding -------------------------------------------------------------------------
def test_padded_text_classifier_equals_the_trainer(tmp_path, one_thread):
    from transformers import AutoTokenizer

    folder = tiny_bert_dir(tmp_path / "bert")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = CORPUS * 3
    encoded = tokenizer(texts)  # variable lengths, no padding
    dataset = datasets.Dataset.from_dict({**encoded, "label": [i % 2 for i in range(len(texts))],
                                          "text": texts}).with_format("torch")
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    args = arguments(tmp_path, per_device_eval_batch_size=5)
    collator = DataCollatorWithPadding(tokenizer)
    fast = FastClientTrainer(model=model, args=args, data_collator=collator, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, data_collator=collator, compute_metrics=accuracy_metrics)
    rows = loaded_rows(fast, dataset)
    assert isinstance(rows, RecordedBatches)
    widths = [batch["input_ids"].shape[1] for batch in rows.batches]
    assert len(set(widths)) > 1  # each batch padded to its own longest row, as the Trainer's collator pads it
    assert_same_evaluation(fast, reference, dataset)


# --- a causal LM: token metrics, labels -100 masked ---------------------------------------------------------------
def test_causal_lm_token_metrics_equal_the_trainer(tmp_path, one_thread):
    from transformers import AutoTokenizer

    folder = tiny_gpt2_dir(tmp_path / "gpt2")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(CORPUS * 2)["input_ids"]
    labels = [[-100] * 2 + row[2:] for row in ids]  # a two-token prompt, not scored
    dataset = datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids],
                                          "labels": labels})
    model = AutoModelForCausalLM.from_pretrained(folder)
    args = arguments(tmp_path, per_device_eval_batch_size=3)
    collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)
    kwargs = dict(model=model, args=args, data_collator=collator, compute_metrics=causal_lm_metrics,
                  preprocess_logits_for_metrics=token_statistics)
    fast, reference = FastClientTrainer(**kwargs), Trainer(**kwargs)
    assert isinstance(loaded_rows(fast, dataset), RecordedBatches)
    got, expected = fast.evaluate(dataset), reference.evaluate(dataset)
    assert {"eval_loss", "eval_perplexity", "eval_token_accuracy", "eval_token_loss"} <= set(got)
    assert measured(got) == measured(expected)
    assert_same_evaluation(fast, reference, dataset)


# --- images with an on-the-fly transform --------------------------------------------------------------------------
class CountingTransform:
    """``with_transform`` function: images -> pixel_values (+ noise when ``noise``), counting its calls."""

    def __init__(self, noise: bool):
        self.noise, self.calls = noise, 0

    def __call__(self, batch):
        self.calls += 1
        pixels = torch.tensor(np.asarray(batch["image"], dtype=np.float32))[:, None]
        if self.noise:  # a random augmentation, drawing from torch's global generator
            pixels = pixels + 0.1 * torch.randn(pixels.shape)
        return {"pixel_values": pixels, "labels": torch.tensor(batch["label"])}


def image_rows() -> datasets.Dataset:
    data = load_digits()
    return datasets.Dataset.from_dict({"image": (data.images[:130] / 16.0).tolist(), "label": data.target[:130].tolist()})


def test_deterministic_transform_is_applied_once(tmp_path, one_thread):
    transform = mark_deterministic(CountingTransform(noise=False))
    dataset = image_rows().with_transform(transform)
    args = arguments(tmp_path, per_device_eval_batch_size=32, remove_unused_columns=False)
    model = digits_cnn()
    fast = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, compute_metrics=accuracy_metrics)
    first = fast.evaluate(dataset)
    calls = transform.calls
    assert calls == 5  # one read of the 5 batches
    assert measured(fast.evaluate(dataset)) == measured(first) == measured(reference.evaluate(dataset))
    assert transform.calls == calls + 5  # the reference's read; none by the kept batches
    assert isinstance(loaded_rows(fast, dataset), RecordedBatches)


def test_random_transform_runs_every_batch_of_every_evaluation(tmp_path, one_thread):
    transform = CountingTransform(noise=True)  # not declared deterministic: never cached
    dataset = image_rows().with_transform(transform)
    args = arguments(tmp_path, per_device_eval_batch_size=32, remove_unused_columns=False)
    model = digits_cnn()
    fast = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, compute_metrics=accuracy_metrics)
    # never kept: read batch by batch, one dataset[rows] call each (mechanism transform_batches)
    assert isinstance(loaded_rows(fast, dataset), TransformedRows)
    results = []
    for trainer in (fast, fast, reference):
        torch.manual_seed(3)
        results.append(measured(trainer.evaluate(dataset)))
    assert results[0] == results[1] == results[2]
    torch.manual_seed(4)
    assert measured(fast.evaluate(dataset)) != results[0]  # the noise is drawn anew
    assert transform.calls == 4 * 5


# --- the Trainer's path where the fast form does not apply ----------------------------------------------------------
def test_unknown_collator_iterable_dataset_and_overridden_data_methods_take_the_trainers_path(tmp_path, one_thread):
    args = arguments(tmp_path)
    model, dataset = digits_cnn(), digits(rows=slice(0, 150))
    reference = Trainer(model=model, args=args, compute_metrics=accuracy_metrics)
    expected = measured(reference.evaluate(dataset))

    unknown = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics,
                                data_collator=lambda rows: default_data_collator(rows))
    assert isinstance(loaded_rows(unknown, dataset), datasets.Dataset)
    assert measured(unknown.evaluate(dataset)) == expected

    fast = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics)
    iterable = dataset.to_iterable_dataset()
    assert not isinstance(loaded_rows(fast, iterable), (TensorRows, RecordedBatches))

    class OwnColumns(FastClientTrainer):
        def _remove_unused_columns(self, dataset, description=None):
            return super()._remove_unused_columns(dataset, description)

    own = OwnColumns(model=model, args=args, compute_metrics=accuracy_metrics)
    assert isinstance(loaded_rows(own, dataset), datasets.Dataset)
    assert measured(own.evaluate(dataset)) == expected


def test_overridden_evaluate_reads_the_same_batches(tmp_path, one_thread):
    """The fast form sits under the Trainer's data methods: an overridden ``evaluate`` (or ``prediction_step``,
    ``compute_loss``) runs as written, on the same batches the Trainer's path gives it."""

    class Extra(FastClientTrainer):
        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
            return {**metrics, f"{metric_key_prefix}_extra": 1.0}

    args = arguments(tmp_path)
    model, dataset = digits_cnn(), digits(rows=slice(0, 150))
    got = Extra(model=model, args=args, compute_metrics=accuracy_metrics).evaluate(dataset)
    expected = Trainer(model=model, args=args, compute_metrics=accuracy_metrics).evaluate(dataset)
    assert measured(got) == {**measured(expected), "eval_extra": 1.0}


# --- the one-process gather of the evaluation loop ------------------------------------------------------------------
@pytest.mark.parametrize("use_gather_object", [False, True])
def test_one_process_gather_gives_the_trainers_numbers(tmp_path, one_thread, use_gather_object):
    """1,797 rows in batches of 64: the last batch (5 rows) is where the accelerator's gather drops the losses
    repeated past the dataset's end; the fast Trainer's loop uses the one-process gather, and gives the same."""
    from hf_fedflat.runtime.eval_data import SingleProcessGather, single_process_gather

    args = arguments(tmp_path, eval_use_gather_object=use_gather_object)
    model, dataset = digits_cnn(), digits()
    with fast_path(True, without=["eval_loop"]):  # the Trainer's loop (the lean one calls the gather once)
        fast = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, compute_metrics=accuracy_metrics)
    gather = single_process_gather(fast)
    assert isinstance(gather, SingleProcessGather) and gather.use_gather_object is use_gather_object
    seen = []
    original = SingleProcessGather.__call__

    def counting(self, data, use_gather_object=None):
        seen.append(self.gradient_state.end_of_dataloader)
        return original(self, data, use_gather_object)

    SingleProcessGather.__call__ = counting
    try:
        assert_same_evaluation(fast, reference, dataset)
    finally:
        SingleProcessGather.__call__ = original
    batches = -(-len(dataset) // 64)
    assert len(seen) == 2 * 3 * batches  # evaluate and predict: losses, logits, labels per batch
    assert fast.gather_function == fast.accelerator.gather_for_metrics  # the Trainer's, set back after the loop


def test_one_process_gather_passes_batches_through_and_truncates_the_last():
    from types import SimpleNamespace

    from hf_fedflat.runtime.eval_data import SingleProcessGather

    calls = []
    state = SimpleNamespace(end_of_dataloader=False)
    accelerator = SimpleNamespace(gradient_state=state,
                                  gather_for_metrics=lambda data, use_gather_object: calls.append(use_gather_object)
                                  or data[:5])
    gather = SingleProcessGather(accelerator)
    batch = torch.arange(64.0)
    assert gather(batch) is batch and calls == []
    state.end_of_dataloader = True
    assert torch.equal(gather(batch), torch.arange(5.0)) and calls == [False]
