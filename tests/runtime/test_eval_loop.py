"""The lean evaluation loop (``hf_fedflat.runtime.eval_loop``, mechanism ``eval_loop``): over an evaluation set read
once, the fast Trainer's ``evaluate`` and ``predict`` give what ``transformers.Trainer`` gives on the same weights
(metrics, predictions, labels, the last batch's rows past the dataset's end dropped, torch's global generator left in
the same state), for an image classifier (kept columns) and a padded text classifier (kept batches); the Trainer's
loop where the lean one does not apply."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, Trainer, TrainingArguments

from hf_fedflat.metrics import accuracy_metrics
from hf_fedflat.models import create_model
from hf_fedflat.runtime import eval_loop, fast_path
from hf_fedflat.runtime.fast_trainer import FastClientTrainer

from helpers.hf_fixtures import CORPUS, tiny_bert_dir

TIMINGS = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


@pytest.fixture(autouse=True)
def fast_path_on():
    with fast_path(True):
        yield


@pytest.fixture
def lean_runs(monkeypatch):
    """How many evaluations the lean loop ran."""
    runs = []
    original = eval_loop.run

    def counting(*args, **kwargs):
        runs.append(args[2])
        return original(*args, **kwargs)

    monkeypatch.setattr(eval_loop, "run", counting)
    return runs


def arguments(tmp_path, **overrides) -> TrainingArguments:
    values = dict(output_dir=str(tmp_path / "out"), per_device_eval_batch_size=64, use_cpu=True, report_to="none",
                  disable_tqdm=True)
    return TrainingArguments(**(values | overrides))


def measured(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.endswith(TIMINGS)}


def digits(rows=slice(None)) -> datasets.Dataset:
    data = load_digits()
    x, y = (data.images / 16.0).astype(np.float32)[:, None][rows], data.target.astype(np.int64)[rows]
    return datasets.Dataset.from_dict({"pixel_values": x.tolist(), "labels": y.tolist()}).with_format("torch")


def digits_cnn():
    torch.manual_seed(0)
    return create_model("small_cnn", num_classes=10, in_chans=1, image_size=8, conv_channels=(8, 16), hidden_dim=48,
                        kernel_size=3)


def evaluations(trainer, dataset, seed=5):
    """evaluate (twice: the model is prepared by the first), predict; torch's generator state after each."""
    out = []
    for _ in range(2):
        torch.manual_seed(seed)
        out.append((measured(trainer.evaluate(dataset)), torch.get_rng_state()))
    torch.manual_seed(seed)
    prediction = trainer.predict(dataset)
    out.append((prediction, torch.get_rng_state()))
    return out


def assert_same(fast_runs, reference_runs):
    for (got, got_rng), (expected, expected_rng) in zip(fast_runs[:2], reference_runs[:2]):
        assert got == expected
        assert torch.equal(got_rng, expected_rng)
    (got, got_rng), (expected, expected_rng) = fast_runs[2], reference_runs[2]
    for a, b in ((got.predictions, expected.predictions), (got.label_ids, expected.label_ids)):
        a, b = (a[0], b[0]) if isinstance(a, tuple) else (a, b)
        assert a.shape == b.shape and np.array_equal(a, b)
    assert got.num_samples if hasattr(got, "num_samples") else True
    assert measured(got.metrics) == measured(expected.metrics)
    assert torch.equal(got_rng, expected_rng)


@pytest.mark.parametrize("compute_metrics", [accuracy_metrics, None])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_image_classifier_equals_the_trainer(tmp_path, one_thread, lean_runs, compute_metrics, label_smoothing):
    """1,797 rows in batches of 64: the last batch has 5 rows, whose losses repeated 64 times are cut to 5."""
    args = arguments(tmp_path, label_smoothing_factor=label_smoothing)
    model, dataset = digits_cnn(), digits()
    fast = FastClientTrainer(model=model, args=args, compute_metrics=compute_metrics)
    reference = Trainer(model=model, args=args, compute_metrics=compute_metrics)
    assert_same(evaluations(fast, dataset), evaluations(reference, dataset))
    assert lean_runs == ["Evaluation", "Prediction"]  # the first evaluation prepared the model: the Trainer's loop
    assert fast.gather_function == fast.accelerator.gather_for_metrics  # left as the Trainer's loop leaves it


def test_padded_text_classifier_equals_the_trainer(tmp_path, one_thread, lean_runs):
    from transformers import AutoTokenizer

    folder = tiny_bert_dir(tmp_path / "bert")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = CORPUS * 3
    encoded = tokenizer(texts)
    dataset = datasets.Dataset.from_dict({**encoded, "label": [i % 2 for i in range(len(texts))]}).with_format("torch")
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    args = arguments(tmp_path, per_device_eval_batch_size=5)
    collator = DataCollatorWithPadding(tokenizer)
    fast = FastClientTrainer(model=model, args=args, data_collator=collator, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, data_collator=collator, compute_metrics=accuracy_metrics)
    assert_same(evaluations(fast, dataset), evaluations(reference, dataset))
    assert lean_runs == ["Evaluation", "Prediction"]


def test_drop_last_and_a_second_dataset(tmp_path, one_thread, lean_runs):
    args = arguments(tmp_path, dataloader_drop_last=True)
    model = digits_cnn()
    fast = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, compute_metrics=accuracy_metrics)
    for dataset in (digits(slice(0, 300)), digits(slice(300, 700))):
        assert_same(evaluations(fast, dataset), evaluations(reference, dataset))
    assert len(lean_runs) == 5


def test_switch_and_unsupported_settings_take_the_trainers_loop(tmp_path, one_thread, lean_runs):
    dataset = digits(slice(0, 200))
    with fast_path(True, without=["eval_loop"]):
        without = FastClientTrainer(model=digits_cnn(), args=arguments(tmp_path))
    batch_metrics = FastClientTrainer(model=digits_cnn(), args=arguments(tmp_path, batch_eval_metrics=True))
    accumulation = FastClientTrainer(model=digits_cnn(), args=arguments(tmp_path, eval_accumulation_steps=2))
    inputs = FastClientTrainer(model=digits_cnn(), args=arguments(tmp_path, include_for_metrics=["inputs"]))
    for trainer in (without, batch_metrics, accumulation, inputs):
        trainer.evaluate(dataset)
        trainer.evaluate(dataset)
    assert lean_runs == []


def test_random_transform_draws_as_in_the_trainers_loop(tmp_path, one_thread, lean_runs):
    """A transform not declared deterministic: read per batch (``runtime.transform_rows``), each batch before the
    previous one is used; the noise it draws, the metrics and torch's generator state are the Trainer's."""
    from hf_fedflat.runtime.transform_rows import TransformedRows

    def noisy(batch):
        pixels = torch.tensor(np.asarray(batch["image"], dtype=np.float32))[:, None]
        return {"pixel_values": pixels + 0.1 * torch.randn(pixels.shape), "labels": torch.tensor(batch["label"])}

    data = load_digits()
    dataset = datasets.Dataset.from_dict({"image": (data.images[:150] / 16.0).tolist(),
                                          "label": data.target[:150].tolist()}).with_transform(noisy)
    args = arguments(tmp_path, per_device_eval_batch_size=32, remove_unused_columns=False)
    model = digits_cnn()
    fast = FastClientTrainer(model=model, args=args, compute_metrics=accuracy_metrics)
    reference = Trainer(model=model, args=args, compute_metrics=accuracy_metrics)
    assert type(fast.get_eval_dataloader(dataset).dataset) is TransformedRows
    assert_same(evaluations(fast, dataset), evaluations(reference, dataset))
    assert lean_runs == ["Evaluation", "Prediction"]


def test_add_all_gives_what_adding_batch_by_batch_gives():
    """One concatenation where the batches share dtype and trailing shape; else each batch added in turn, so that a
    batch of another width is padded with -100 as the Trainer's container pads it."""
    from transformers.trainer_pt_utils import EvalLoopContainer

    same = EvalLoopContainer(True, padding_index=-100)
    eval_loop._add_all(same, [torch.tensor([[1, 2], [3, 4]]), torch.tensor([[5, 6]])])
    np.testing.assert_array_equal(same.get_arrays(), [[1, 2], [3, 4], [5, 6]])

    wider = EvalLoopContainer(True, padding_index=-100)
    eval_loop._add_all(wider, [torch.tensor([[1, 2]]), torch.tensor([[3, 4, 5]])])
    np.testing.assert_array_equal(wider.get_arrays(), [[1, 2, -100], [3, 4, 5]])

    listed = EvalLoopContainer(False)
    eval_loop._add_all(listed, [torch.tensor([1.0]), torch.tensor([2.0, 3.0])])
    assert [a.tolist() for a in listed.get_arrays()] == [[1.0], [2.0, 3.0]]

    nested = EvalLoopContainer(True)
    eval_loop._add_all(nested, [(torch.tensor([1]), torch.tensor([[7.0]])), (torch.tensor([2]), torch.tensor([[8.0]]))])
    ids, scores = nested.get_arrays()
    assert ids.tolist() == [1, 2] and scores.tolist() == [[7.0], [8.0]]
