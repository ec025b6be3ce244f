"""benchmarks/whole_run.py at smoke sizes: each plain loop does the library's work (the same final weights, the same
accuracy every round), and the records carry ratio, target and the raw times. No timing is checked."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from helpers import load_benchmark

@pytest.fixture(scope="module")
def W():
    module = load_benchmark("whole_run")
    threads = torch.get_num_threads()
    yield module
    torch.set_num_threads(threads)  # (its main sets this process's thread count)
    del sys.modules[module.__name__]


@pytest.fixture(scope="module")
def records(W):
    return {r["name"]: r for r in W.main(["--smoke", "--only", "digits,transform,gossip"])}


def test_sections_record_each_row_with_its_target(records):
    targets = {name: r["target"] for name, r in records.items()}
    assert targets == {"whole_run_digits_eval_vs_plain_loop": 1.15, "whole_run_digits_no_eval_vs_plain_loop": 1.10,
                       "whole_run_transform_eval_vs_plain_loop": 1.25,
                       "whole_run_transform_deterministic_eval_vs_plain_loop": 1.25,
                       "whole_run_gossip_eval_vs_plain_loop": 1.25}
    for r in records.values():
        assert r["ratio"] > 0 and isinstance(r["passed"], bool)
        assert r["details"]["timed_rounds"] == 2  # 3 smoke rounds, round 0 untimed


def test_plain_loops_train_and_evaluate_what_the_library_does(records):
    for r in records.values():
        assert r["details"]["max_abs_weight_diff"] == 0.0, r["name"]
    for name in ("whole_run_digits_eval_vs_plain_loop", "whole_run_transform_eval_vs_plain_loop",
                 "whole_run_transform_deterministic_eval_vs_plain_loop"):
        agreement = records[name]["details"]["eval_max_abs_diff"]
        assert agreement["eval_accuracy"] == 0.0  # the same predictions on all 1,797 rows, every round
        assert agreement["eval_loss"] < 1e-6  # (the mean of batch means in another order)
    gossip = records["whole_run_gossip_eval_vs_plain_loop"]["details"]
    assert gossip["eval_max_abs_diff"] == {**gossip["eval_max_abs_diff"], "eval_accuracy": 0.0,
                                           "local_eval_accuracy_mean": 0.0}
    assert gossip["evaluations_per_round"] == 4 + 1  # every local model and the average: no thinning


def test_ring_weights_are_a_third_to_self_and_each_neighbour(W):
    expected = np.zeros((5, 5))
    for i, (left, right) in enumerate([(4, 1), (0, 2), (1, 3), (2, 4), (3, 0)]):
        expected[i, [left, i, right]] = 1 / 3
    assert np.array_equal(W.ring_weights(5), expected)
    assert np.array_equal(W.ring_weights(3), np.full((3, 3), 1 / 3))


def test_the_transform_builds_the_images_of_the_array_rows(W):
    d = W.load_digit_arrays()
    rows = W.transformed_dataset(d)[[0, 5, 1796]]
    assert torch.equal(rows["pixel_values"], d.x[[0, 5, 1796]])
    assert rows["labels"].tolist() == d.y[[0, 5, 1796]].tolist()
    assert float(d.x.max()) == 1.0 and float(d.x.min()) == 0.0  # counts 0..16 over 16


def test_plain_evaluator_is_the_row_weighted_loss_and_the_accuracy(W):
    class Fixed(torch.nn.Module):  # logits given per row: class 0 for the first 3 rows, class 1 after
        def forward(self, pixel_values, labels):
            logits = torch.stack([pixel_values[:, 0], 1 - pixel_values[:, 0]], dim=1)
            return type("Out", (), {"logits": logits,
                                    "loss": torch.nn.functional.cross_entropy(logits, labels)})()

    x = torch.tensor([[1.0], [1.0], [1.0], [0.0], [0.0]])
    labels = torch.tensor([0, 0, 1, 1, 0])
    batches = lambda: [{"pixel_values": x[:2], "labels": labels[:2]},  # noqa: E731
                       {"pixel_values": x[2:], "labels": labels[2:]}]
    metrics = W.plain_evaluator(batches, "cpu")(Fixed())
    assert metrics["eval_accuracy"] == pytest.approx(3 / 5)
    # per row: -log softmax; right with margin 1: log(1 + e^-1), wrong: log(1 + e)
    right, wrong = np.log1p(np.exp(-1)), np.log1p(np.exp(1))
    assert metrics["eval_loss"] == pytest.approx((3 * right + 2 * wrong) / 5, rel=1e-6)
