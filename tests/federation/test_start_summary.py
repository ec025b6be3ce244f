"""The start-of-run summary: the label numbers on hand-made partitions, the one-class warning and its flags, and
the block a trainer logs (or prints) once when training starts."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hf_fedflat import FedTrainingArguments
from hf_fedflat.data.partition import ClientPartition
from hf_fedflat.federation.start_summary import StartSummaryCallback, client_label_summary, start_of_run_summary


def partition_of(counts, scheme="dirichlet", alpha=0.3, classes_per_client=None) -> ClientPartition:
    counts = np.asarray(counts)
    starts = np.concatenate([[0], np.cumsum(counts.sum(axis=1))])
    indices = [np.arange(starts[i], starts[i + 1]) for i in range(len(counts))]
    return ClientPartition(indices, counts, scheme, alpha, 42, [f"c{j}" for j in range(counts.shape[1])],
                           classes_per_client=classes_per_client)


#: the 4-client Dir(0.3) split of a text run: [136, 1], [238, 55], [0, 343], [128, 99]
TEXT_RUN = [[136, 1], [238, 55], [0, 343], [128, 99]]


def test_label_numbers_of_the_text_runs_split():
    summary = client_label_summary(TEXT_RUN)
    # classes held: 2, 2, 1, 2; largest share: 136/137 = 0.993, 238/293 = 0.812, 343/343 = 1, 128/227 = 0.564
    assert summary.classes_held == (1, 2.0, 2)
    assert summary.one_class_clients == 2 and summary.clients_with_rows == 4 and summary.empty_clients == 0
    assert summary.one_class_fraction == 0.5 and not summary.mostly_one_class  # half is not most


def test_label_numbers_with_an_empty_client_and_the_90_percent_boundary():
    counts = [[10, 0, 0], [9, 1, 0], [5, 5, 0], [0, 0, 0], [1, 1, 8], [0, 7, 0]]
    summary = client_label_summary(counts)
    # the empty client is left out; held 1, 2, 2, 3, 1 (median 2); one class: 10/10, 9/10 (= 0.9 counts), 7/7
    assert summary.empty_clients == 1 and summary.clients_with_rows == 5
    assert summary.classes_held == (1, 2.0, 3)
    assert summary.one_class_clients == 3 and summary.one_class_fraction == pytest.approx(0.6)
    assert summary.mostly_one_class


def test_label_numbers_of_many_clients_match_a_loop():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, size=(5000, 10)) * (rng.random((5000, 10)) < 0.2)
    summary = client_label_summary(counts)
    rows = [r for r in counts.tolist() if sum(r)]
    held = sorted(sum(1 for c in r if c) for r in rows)
    assert summary.clients_with_rows == len(rows)
    assert summary.classes_held == (held[0], float(np.median(held)), held[-1])
    assert summary.one_class_clients == sum(1 for r in rows if max(r) >= 0.9 * sum(r))


def test_one_class_task_has_no_label_line():
    text, warning = start_of_run_summary(FedTrainingArguments(output_dir="unused", num_clients=2),
                                         partition_of([[5], [7]], scheme="iid", alpha=None))
    assert "labels:" not in text and warning is None


@pytest.fixture
def args(tmp_path):
    return FedTrainingArguments(output_dir=str(tmp_path), num_clients=6, clients_per_round=3, num_rounds=4,
                                local_epochs=2, per_device_train_batch_size=16, lr_decay_per_round=0.998)


SKEWED = [[50, 0], [0, 40], [30, 1], [2, 60], [45, 0], [20, 20]]  # 5 of 6 clients >= 90% one class


def test_summary_block_names_the_settings_and_the_label_numbers(args):
    text, warning = start_of_run_summary(args, partition_of(SKEWED))
    assert text.splitlines()[0] == ("Run: fedavg (perturbation none, corrections -, aggregator mean), 4 rounds")
    assert ("local training: sgd, learning_rate 0.01 (constant within a round, x0.998 per round); batch 16, "
            "2 local epochs per round") in text
    assert "unset, so by default: optim sgd: the papers', for the built-in models" in text
    # rows 50, 40, 31, 62, 45, 40: sorted 31 40 40 45 50 62
    assert "partition: dirichlet(alpha=0.3), 6 clients, 3 per round; rows per client min 31 / median 42.5 / max 62" in text
    # held 1, 1, 2, 2, 1, 2; one class: 50/50, 40/40, 30/31, 60/62, 45/45 (20/40 not)
    assert ("labels: 2 classes; classes per client min 1 / median 1.5 / max 2; 5 of 6 clients (83%) have >= 90% "
            "of their rows in one class") in text
    assert warning.startswith("Most clients (5 of 6) hold essentially one class")
    assert "raise --dirichlet_alpha (now 0.3; 1.0 or more mixes classes) or use --partition_scheme iid" in warning


def test_decentralized_full_participation_says_every_client_trains(tmp_path):
    gossip = FedTrainingArguments(output_dir=str(tmp_path), fed_algorithm="dfedavg", num_clients=6,
                                  clients_per_round=3, decentralized_participation="full")
    text, _ = start_of_run_summary(gossip, partition_of(SKEWED))
    assert "partition: dirichlet(alpha=0.3), 6 clients, all train every round (gossip);" in text
    sampled = FedTrainingArguments(output_dir=str(tmp_path), fed_algorithm="dfedavg", num_clients=6,
                                   clients_per_round=3, decentralized_participation="sampled")
    assert "6 clients, 3 per round;" in start_of_run_summary(sampled, partition_of(SKEWED))[0]


def test_warning_names_the_flags_of_the_scheme(args):
    _, pathological = start_of_run_summary(args, partition_of(SKEWED, "pathological", None, classes_per_client=1))
    assert "raise --classes_per_client (now 1) or use --partition_scheme iid" in pathological
    _, balanced = start_of_run_summary(args, partition_of([[20, 20], [25, 15], [10, 30], [1, 30], [5, 5], [9, 9]]))
    assert balanced is None


class _Trainer:
    def __init__(self, args, partition):
        self.args, self.partition = args, partition


def test_callback_logs_the_block_and_the_warning(args, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="hf_fedflat.federation.start_summary"):
        StartSummaryCallback().on_train_begin(_Trainer(args, partition_of(SKEWED)))
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert messages[0][0] == "INFO" and messages[0][1].startswith("Run: fedavg")
    assert messages[1][0] == "WARNING" and "--dirichlet_alpha" in messages[1][1]
    assert "Run: fedavg" not in capsys.readouterr().out  # logged, not printed twice


def test_callback_prints_the_block_when_info_logs_are_not_shown(args, capsys):
    logger = logging.getLogger("hf_fedflat.federation.start_summary")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        StartSummaryCallback().on_train_begin(_Trainer(args, partition_of(SKEWED)))
    finally:
        logger.setLevel(level)
    assert capsys.readouterr().out.startswith("Run: fedavg")


def test_a_private_run_states_its_mechanism_and_the_epsilon_its_rounds_spend(tmp_path):
    from hf_fedflat.privacy import ClientLevelAccountant

    private = FedTrainingArguments(output_dir=str(tmp_path), fed_algorithm="dp_fedsam", num_clients=6,
                                   clients_per_round=3, num_rounds=10)
    spent = ClientLevelAccountant(0.95, 0.5, 1 / 60).epsilon(10)
    assert (f"  privacy: client-level DP, clip norm 0.2, noise multiplier 0.95 added on the clients, Poisson "
            f"sampling q = 0.5; epsilon {spent:.4g} at delta 0.0167 after 10 rounds\n") in \
        start_of_run_summary(private, partition_of(SKEWED))[0]
    plain = FedTrainingArguments(output_dir=str(tmp_path), fed_algorithm="fedsam", num_clients=6)
    assert "privacy" not in start_of_run_summary(plain, partition_of(SKEWED))[0]
