"""FedSWA (``+swa``, the plug-in in front of any aggregator): the cyclic client learning rate
``(1 - t) lr_1 + t lr_2``, ``t = ((i mod c) + 1)/c`` from round ``s0``, the server's average of the models at the end
of each cycle over rounds of partial participation, and the model evaluated and saved, computed by hand; in whole
runs on the tiny model and on a tiny BERT text classifier; refused by a decentralized run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hf_fedflat import FederatedCallback, FedTrainingArguments, build_algorithm
from hf_fedflat.algorithms import ClientUpdate

from helpers.runs import run
from step_helpers import server, vector

DIM = 5


def test_client_learning_rate_cycles_from_the_start_round(tmp_path):
    """20 rounds, s0 = int(0.5 * 20) = 10, c = 4: rounds 10..19 run at (1 - t) lr + t lr_2, t = 1/4 .. 1."""
    lr_2 = 1e-3
    algorithm = server(tmp_path, fed_algorithm="fedsam+swa", num_rounds=20, swa_start_fraction=0.5,
                       swa_cycle_rounds=4, swa_learning_rate=lr_2)
    for i in range(20):
        lr = 0.1 * 0.9**i  # the run's schedule
        t = {0: 0.25, 1: 0.5, 2: 0.75, 3: 1.0}[i % 4]
        expected = lr if i < 10 else (1 - t) * lr + t * lr_2
        assert algorithm.aggregator.client_learning_rate(i, lr) == pytest.approx(expected, rel=1e-12)
    assert algorithm.aggregator.client_learning_rate(13, 0.1) == pytest.approx(0.5 * 0.1 + 0.5 * lr_2)


def test_several_rounds_average_the_models_at_the_end_of_each_cycle(tmp_path):
    """8 rounds, s0 = 2, c = 3: the rounds with t = 1 are 2 (i mod 3 = 2) and 5, so w_swa = w^3, then
    (w^3 + w^6)/2; the rule in front of which it sits (the mean) aggregates as it does alone."""
    plain = server(tmp_path, fed_algorithm="fedavg")
    algorithm = server(tmp_path, fed_algorithm="fedavg+swa", num_rounds=8, swa_start_fraction=0.25,
                       swa_cycle_rounds=3)
    aggregator = algorithm.aggregator
    w = vector(DIM, 1, 1.0)
    state = algorithm.init_server_state(w)
    globals_after, expected_swa = [], None
    for t, clients in enumerate([(0, 1), (2, 3, 4), (1,), (0, 4), (2, 3), (1, 2, 4), (0,), (3, 4)]):
        updates = [ClientUpdate(k, 8 + k, 2, 0.0, vector(DIM, 10 * t + k, 0.2)) for k in clients]
        p = torch.tensor([u.num_samples for u in updates], dtype=torch.float64)
        p = p / p.sum()
        assert torch.equal(aggregator.broadcast_weights(t, w, state["aggregator"]), w)
        expected_w = w + sum(float(pk) * u.delta for pk, u in zip(p, updates))
        plain_w, _ = plain.server_step(t, w, updates, p, {}, num_clients=5)
        w, state = algorithm.server_step(t, w, updates, p, state, num_clients=5)
        torch.testing.assert_close(w, expected_w, rtol=0, atol=1e-6)
        assert torch.equal(w, plain_w)
        globals_after.append(w.clone())
        if t == 2:
            expected_swa = globals_after[2]
        elif t == 5:
            expected_swa = (globals_after[2] + globals_after[5]) / 2
        evaluated = aggregator.evaluation_weights(w, state["aggregator"])
        if expected_swa is None:  # before the first fold: the training model
            assert evaluated is w
        else:
            torch.testing.assert_close(evaluated, expected_swa, rtol=0, atol=1e-6)
    assert int(state["aggregator"]["swa_models"]) == 2


def test_it_composes_with_any_client_method(tmp_path):
    for preset, perturbation in (("fedsam", "sam"), ("fedasam", "asam"), ("fedavg", "none"), ("scaffold", "none")):
        algorithm = server(tmp_path, fed_algorithm=f"{preset}+swa")
        assert algorithm.perturbation.name == perturbation
        assert algorithm.aggregator.name == "mean+swa" and algorithm.aggregator.capabilities.linear_in_weighted_delta


class GlobalModels(FederatedCallback):
    """The server's ``w^{t+1}`` after every round (what training continues from)."""

    def __init__(self):
        self.models = []

    def on_round_end(self, trainer, round_index, record, **kwargs):
        self.models.append(trainer.strategy.model()["params"].clone())


def test_a_run_evaluates_and_saves_the_average_and_trains_on(tmp_path):
    """4 rounds, s0 = 0, c = 2: learning rates 0.5 lr_t + 0.5 lr_2, lr_2, ...; folds after rounds 1 and 3, so the
    final model is (w^2 + w^4)/2, evaluated in the last record and saved in final_model/."""
    lr_2 = 0.01
    recorder = GlobalModels()
    trainer, output = run(tmp_path, fed_algorithm="fedsam+swa", swa_start_fraction=0.0, swa_cycle_rounds=2,
                          swa_learning_rate=lr_2, callbacks=[recorder])
    rates = [r["learning_rate"] for r in output.history]
    assert rates == pytest.approx([0.5 * 0.1 + 0.5 * lr_2, lr_2, 0.5 * 0.1 * 0.81 + 0.5 * lr_2, lr_2], rel=1e-12)
    w_swa = (recorder.models[1] + recorder.models[3]) / 2
    torch.testing.assert_close(output.params, w_swa, rtol=0, atol=1e-6)
    assert (recorder.models[3] - w_swa).abs().max() > 1e-4  # the average differs from the model trained on
    saved = load_file(str(tmp_path / "final_model" / "model.safetensors"))
    torch.testing.assert_close(torch.cat([saved[n].reshape(-1) for n in trainer.space.names]), output.params,
                               rtol=0, atol=0)
    assert output.history[-1]["eval_loss"] == pytest.approx(trainer.evaluate_weights(w_swa)["eval_loss"], rel=1e-6)


def test_a_decentralized_run_refuses_the_plugin(tmp_path):
    with pytest.raises(ValueError, match=r"\+swa"):
        build_algorithm(FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fed_algorithm="dfedsam+swa",
                                             num_clients=4, clients_per_round=2))


@pytest.mark.usefixtures("one_thread")
def test_bert_text_classifier_saves_the_model_it_evaluated(tmp_path):
    """FedGloSS + SWA on a tiny BERT through the command line: the saved final model (w_swa) reloads and gives the
    last record's evaluation loss."""
    import datasets
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from hf_fedflat.cli import main
    from hf_fedflat.data.tiny_text import write_sentiment_data, write_tiny_model

    bert = write_tiny_model(tmp_path / "bert", "bert")
    data = write_sentiment_data(tmp_path / "sentiment", train_rows=40, test_rows=12)
    out = tmp_path / "run"
    assert main(["train", "--model_name_or_path", bert, "--dataset_name", data, "--output_dir", str(out),
                 "--fed_algorithm", "fedgloss+swa", "--swa_start_fraction", "0", "--swa_cycle_rounds", "2",
                 "--rho_warmup_rounds", "0", "--num_rounds", "2", "--num_clients", "4", "--clients_per_round", "2",
                 "--local_steps", "2", "--learning_rate", "0.05", "--per_device_train_batch_size", "8",
                 "--use_cpu", "true", "--seed", "3", "--save_every_n_rounds", "0", "--report_to", "none"]) == 0
    last = json.loads((out / "history.json").read_text())[-1]
    model = AutoModelForSequenceClassification.from_pretrained(out / "final_model")
    tokenizer = AutoTokenizer.from_pretrained(out / "final_model")
    test = datasets.load_from_disk(data)["test"]
    batch = tokenizer(list(test["text"]), padding=True, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        loss = model(**batch, labels=torch.tensor(test["label"])).loss
    assert float(loss) == pytest.approx(last["eval_loss"], rel=1e-4)
