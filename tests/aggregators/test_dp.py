"""Client-level differential privacy (``+dp``): the clipping, the release of one round in central and client mode and
the noise of each, computed by hand; the noise's mean and variance per coordinate over many draws; the Poisson
sampling; the refused compositions, each one line and exit status 2; whole runs: epsilon per round, the budget that
stops a run, and a resume that continues the accountant."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from scipy import stats

from hf_fedflat import FedTrainingArguments, cli
from hf_fedflat.aggregators.dp import clip_update, gaussian_noise, poisson_sample, stream_seed
from hf_fedflat.algorithms import ClientContext, ClientUpdate
from hf_fedflat.algorithms.registry import CORRECTIONS, PERTURBATIONS
from hf_fedflat.algorithms.base import RoundSummary
from hf_fedflat.algorithms.composed import build_piece
from hf_fedflat.cli.exit_codes import EXIT_BAD_INPUT
from hf_fedflat.privacy import ClientLevelAccountant

from helpers.runs import run
from step_helpers import server, vector

DIM = 6
SEED = 42  # FedTrainingArguments' default seed
SIGMA, CLIP = 0.8, 0.5
#: every statistical check below together raises a false alarm with probability below 1e-6 for a random seed;
#: with the fixed seeds used the outcome is fixed
FALSE_ALARM = 1e-6


def by_hand_clip(delta: torch.Tensor, clip: float) -> torch.Tensor:
    norm = math.sqrt(sum(float(x) ** 2 for x in delta))
    return delta * min(1.0, clip / norm) if norm > 0 else delta.clone()


def seeded_normal(numel: int, *stream) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(stream_seed(SEED, "dp", *stream)))


def dp_server(tmp_path, **overrides):
    settings = dict(fed_algorithm="fedavg+dp", aggregation_weights="uniform", dp_noise_multiplier=SIGMA,
                    dp_clip_norm=CLIP)
    return server(tmp_path, **{**settings, **overrides})  # 5 clients, m = 3 per round


# --- clipping -----------------------------------------------------------------------------------------------
def test_clipping_scales_the_whole_update_to_norm_C():
    delta = torch.tensor([3.0, 4.0, 0.0, 12.0])  # ||delta|| = 13: one norm over all entries, not per tensor
    torch.testing.assert_close(clip_update(delta, 6.5), torch.tensor([1.5, 2.0, 0.0, 6.0]))
    torch.testing.assert_close(clip_update(delta, 13.0), delta)  # at the bound: unchanged
    torch.testing.assert_close(clip_update(delta, 100.0), delta)  # inside it: unchanged
    assert torch.equal(clip_update(torch.zeros(3), 1.0), torch.zeros(3))


# --- one round, by hand -------------------------------------------------------------------------------------
def test_central_release_is_the_clipped_sum_plus_noise_over_m(tmp_path):
    """w^{t+1} = w^t + (sum_i clip(Delta_i) + sigma C z) / m, m = 3 whatever number of updates arrived (two here:
    the third sampled client failed); the mean rule behind gets only that release."""
    algorithm = dp_server(tmp_path)
    w = vector(DIM, 1, 1.0)
    state = algorithm.init_server_state(w)
    deltas = [vector(DIM, 5, 2.0), vector(DIM, 6, 0.01)]  # one clipped, one inside the ball
    updates = [ClientUpdate(k, 8, 2, 0.0, d) for k, d in enumerate(deltas)]
    new_w, new_state = algorithm.server_step(3, w, updates, torch.full((2,), 0.5, dtype=torch.float64), state, 5)
    expected = w + (by_hand_clip(deltas[0], CLIP) + by_hand_clip(deltas[1], CLIP)
                    + SIGMA * CLIP * seeded_normal(DIM, "server", 3)) / 3
    torch.testing.assert_close(new_w, expected, rtol=0, atol=1e-6)
    assert int(new_state["aggregator"]["dp_round"]) == 3


def sampled(t: int) -> list[int]:
    """Round t's Poisson sample of the 5 clients at q = 3/5, drawn here as the plug-in draws it."""
    uniform = torch.rand(5, generator=torch.Generator().manual_seed(stream_seed(SEED, "dp-sample", t)),
                         dtype=torch.float64)
    return [i for i in range(5) if uniform[i] < 0.6]


@pytest.mark.parametrize("t", [7, 3], ids=["fewer_than_m_sampled", "more_than_m_sampled"])
def test_client_release_is_clipped_and_noised_on_the_client_and_averaged_with_the_missing_shares(tmp_path, t):
    """k_t = max(n_t, m) shares, m = 3: client i of round t sends clip(Delta_i) + sigma C / sqrt(k_t) z_{t,i}; two
    arrive, the server adds sqrt((k_t - 2)/k_t) sigma C z_t for the others and divides by m: the sum's noise is
    exactly N(0, sigma^2 C^2) whatever n_t."""
    k = max(len(sampled(t)), 3)
    assert k == {7: 3, 3: 4}[t]  # round 7 samples 2 clients, round 3 samples 4
    algorithm = dp_server(tmp_path, dp_noise="client")
    w = vector(DIM, 1, 1.0)
    deltas = {0: vector(DIM, 5, 2.0), 4: vector(DIM, 6, 0.01)}
    sent = {}
    for client, delta in deltas.items():
        ctx = ClientContext(client, t, w, {}, {}, 0.1, 8)
        sent[client] = algorithm.release_update(ctx, delta)
        expected = by_hand_clip(delta, CLIP) + SIGMA * CLIP / math.sqrt(k) * seeded_normal(DIM, "client", t, client)
        torch.testing.assert_close(sent[client], expected, rtol=0, atol=1e-6)
    updates = [ClientUpdate(c, 8, 2, 0.0, d) for c, d in sent.items()]
    new_w, _ = algorithm.server_step(t, w, updates, torch.full((2,), 0.5, dtype=torch.float64),
                                     algorithm.init_server_state(w), 5)
    top_up = math.sqrt((k - 2) / k) * SIGMA * CLIP * seeded_normal(DIM, "server", t)
    torch.testing.assert_close(new_w, w + (sent[0] + sent[4] + top_up) / 3, rtol=0, atol=1e-6)


def test_a_round_without_updates_still_releases_its_noise(tmp_path):
    algorithm = dp_server(tmp_path)
    w = vector(DIM, 1, 1.0)
    new_w, _ = algorithm.server_step(2, w, [], None, algorithm.init_server_state(w), 5)
    torch.testing.assert_close(new_w, w + SIGMA * CLIP * seeded_normal(DIM, "server", 2) / 3, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rule", ["fedadam", "fedswa"])
def test_the_rule_behind_receives_the_release_as_its_one_update(tmp_path, rule):
    """FedAdam's moments and FedSWA's state (behind ``+dp``, with their own keys beside ``dp_round``) evolve as the
    rule alone does on the release (sum_i clip(Delta_i) + sigma C z) / m, with weight 1."""
    algorithm = dp_server(tmp_path, fed_algorithm=f"{rule}+dp", num_rounds=4, swa_start_fraction=0.25,
                          swa_cycle_rounds=1)
    plain = server(tmp_path, fed_algorithm=rule, num_rounds=4, swa_start_fraction=0.25, swa_cycle_rounds=1)
    w = plain_w = vector(DIM, 1, 1.0)
    state, plain_state = algorithm.init_server_state(w), plain.init_server_state(w)
    for t in range(3):
        deltas = [vector(DIM, 10 * t + k, 1.0) for k in range(3)]
        release = (sum(by_hand_clip(d, CLIP) for d in deltas) + SIGMA * CLIP * seeded_normal(DIM, "server", t)) / 3
        w, state = algorithm.server_step(t, w, [ClientUpdate(k, 8, 2, 0.0, d) for k, d in enumerate(deltas)],
                                         torch.full((3,), 1 / 3, dtype=torch.float64), state, 5)
        plain_w, plain_state = plain.server_step(t, plain_w, [ClientUpdate(-1, 24, 2, 0.0, release)],
                                                 torch.ones(1, dtype=torch.float64), plain_state, 5)
        torch.testing.assert_close(w, plain_w, rtol=0, atol=1e-6)
    kept = {k: v for k, v in state["aggregator"].items() if k != "dp_round"}
    assert kept.keys() == plain_state["aggregator"].keys()
    for key, value in kept.items():
        torch.testing.assert_close(value, plain_state["aggregator"][key], rtol=0, atol=1e-6)
    torch.testing.assert_close(algorithm.aggregator.evaluation_weights(w, state["aggregator"]),
                               plain.aggregator.evaluation_weights(plain_w, plain_state["aggregator"]),
                               rtol=0, atol=1e-6)


def test_central_mode_sends_the_update_as_it_is(tmp_path):
    algorithm = dp_server(tmp_path)
    delta = vector(DIM, 5, 2.0)
    assert torch.equal(algorithm.release_update(ClientContext(0, 0, delta, {}, {}, 0.1, 8), delta), delta)


# --- the noise and the sampling, statistically ----------------------------------------------------------------
def check_mean_and_variance(draws: torch.Tensor, std: float, false_alarm: float) -> None:
    """Per coordinate (column) of ``draws`` (rows: independent draws): the sample mean against N(0, std^2/R) and
    (R-1) S^2 / std^2 against chi^2(R-1), each two-sided; the family's false-alarm rate is ``false_alarm``."""
    rows, columns = draws.shape
    per_test = false_alarm / (2 * columns)  # union bound: a mean and a variance test per coordinate
    draws = draws.double()
    z = stats.norm.isf(per_test / 2)
    means = draws.mean(dim=0)
    assert (means.abs() <= z * std / math.sqrt(rows)).all(), means.abs().max()
    scaled = (rows - 1) * draws.var(dim=0) / std**2
    low, high = stats.chi2.ppf(per_test / 2, rows - 1), stats.chi2.isf(per_test / 2, rows - 1)
    assert ((scaled >= low) & (scaled <= high)).all(), (scaled.min(), scaled.max(), low, high)


def test_client_noise_has_mean_zero_and_variance_sigma2_C2_over_k_t_per_coordinate(tmp_path):
    """4,000 clients' releases of a zero update (clip(0) = 0: the noise alone), 40 coordinates, each divided by its
    round's sigma C / sqrt(k_t): N(0, 1) per coordinate."""
    algorithm = dp_server(tmp_path, dp_noise="client")
    zero = torch.zeros(40)
    draws = torch.stack([algorithm.release_update(ClientContext(c % 5, c // 5, zero, {}, {}, 0.1, 8), zero)
                         / (SIGMA * CLIP / math.sqrt(max(len(sampled(c // 5)), 3))) for c in range(4000)])
    check_mean_and_variance(draws, 1.0, FALSE_ALARM / 2)


def test_the_cryptographic_source_has_mean_zero_and_the_asked_variance():
    """Not seeded: this check fails by chance with probability below 1e-6."""
    draws = torch.stack([gaussian_noise(40, 2.5, None) for _ in range(4000)])
    check_mean_and_variance(draws, 2.5, FALSE_ALARM / 2)
    assert not torch.equal(gaussian_noise(40, 1.0, None), gaussian_noise(40, 1.0, None))


def test_poisson_sampling_is_seeded_and_takes_each_client_with_probability_q():
    assert poisson_sample(50, 0.2, 9) == poisson_sample(50, 0.2, 9)
    counts = torch.zeros(50)
    rounds = 2000
    for t in range(rounds):
        for client in poisson_sample(50, 0.2, stream_seed(1, "dp-sample", t)):
            counts[client] += 1
    # each count ~ Binomial(2000, 0.2): two-sided bounds, union over the 50 clients
    low = stats.binom.ppf(FALSE_ALARM / 100, rounds, 0.2)
    high = stats.binom.isf(FALSE_ALARM / 100, rounds, 0.2)
    assert ((counts >= low) & (counts <= high)).all(), (counts.min(), counts.max(), low, high)


# --- what the capability that refusals read says -----------------------------------------------------------------
def _reads_updates(cls, tmp_path) -> bool:
    """Whether the piece's server half changes (or fails) when the clients' own uploads are NaN."""
    args = FedTrainingArguments(output_dir=str(tmp_path), use_cpu=True, num_clients=5, clients_per_round=3)
    piece = build_piece(cls, args)
    w = torch.ones(DIM)
    state = piece.init_server_state(w)
    if not state:
        return False
    poisoned = [ClientUpdate(0, 8, 2, 0.0, torch.full((DIM,), float("nan")),
                             messages={piece.name: {k: torch.full((DIM,), float("nan")) for k in ("mu", "grad")}})]
    summary = RoundSummary(0, w, w + 1, poisoned, torch.ones(1, dtype=torch.float64), 5, 0.1)
    try:
        new = piece.update_server_state(state, summary)
    except Exception:  # noqa: BLE001 (a server half that needs a message of its own reads the uploads)
        return True
    return any(not torch.isfinite(t).all() for t in new.values())


@pytest.mark.parametrize("cls", [*PERTURBATIONS.values(), *CORRECTIONS.values()], ids=lambda c: c.name)
def test_server_reads_updates_is_declared_by_exactly_the_pieces_whose_server_half_reads_them(cls, tmp_path):
    assert cls.server_reads_updates == _reads_updates(cls, tmp_path)


# --- refused compositions: one line, exit status 2 ------------------------------------------------------------
DIGITS = ["--dataset_name", "digits", "--image_size", "8", "--num_clients", "10", "--clients_per_round", "2",
          "--num_rounds", "2", "--local_steps", "1", "--use_cpu", "true", "--disable_tqdm", "true",
          "--report_to", "none"]
UNIFORM = ["--aggregation_weights", "uniform", "--dp_noise_multiplier", "1.0"]

REFUSED = [
    ("sample-count weights", ["--fed_algorithm", "fedsam+dp", "--dp_noise_multiplier", "1.0"],
     r"aggregation_weights: \+dp averages the clipped updates with uniform weights"),
    ("FedGH behind +dp", ["--fed_algorithm", "fedgh+dp", "--dp_noise_multiplier", "1.0"],
     r"fed_algorithm: \+dp releases only the noised mean of the clipped updates, but the rule behind it, mean\+fedgh"),
    ("a rule in front of +dp", ["--fed_algorithm", "dp_fedavg+fedgh"],
     r"fed_algorithm: mean\+dp\+fedgh: \+dp releases a noised mean and must be the last plug-in"),
    ("FedDyn's server rule", ["--fed_algorithm", "feddyn+dp", *UNIFORM],
     r"fed_algorithm: \+dp releases only the noised mean .* the rule behind it, feddyn,"),
    ("SCAFFOLD's control variates", ["--fed_algorithm", "scaffold+dp", *UNIFORM],
     r"fed_algorithm: the server half of scaffold reads each client's upload"),
    ("FedWMSAM's momentum", ["--fed_algorithm", "fedwmsam+dp", *UNIFORM],
     r"fed_algorithm: the server half of wmsam reads each client's upload"),
    ("FedDC's drift", ["--fed_algorithm", "feddc+dp", *UNIFORM],
     r"fed_algorithm: \+dp releases only the noised mean .* the rule behind it, shifted_mean,"),
    ("FedGMT's dual", ["--fed_algorithm", "fedgmt+dp", *UNIFORM],
     r"fed_algorithm: \+dp releases only the noised mean .* the rule behind it, fedgmt,"),
    ("a correction given by flag", ["--fed_algorithm", "dp_fedavg", "--corrections", "momentum"],
     r"fed_algorithm: the server half of momentum reads each client's upload"),
    ("decentralized", ["--fed_algorithm", "dfedavg+dp", "--dp_noise_multiplier", "1.0"],
     r"fed_algorithm: the plug-in\(s\) \+dp transform the updates a server aggregates"),
    ("averaged BatchNorm statistics", ["--fed_algorithm", "dp_fedavg", "--batchnorm_buffers", "average"],
     r"batchnorm_buffers: 'average' sends each client's BatchNorm statistics"),
    ("neither sigma nor a budget", ["--fed_algorithm", "fedavg+dp", "--aggregation_weights", "uniform"],
     r"dp_noise_multiplier: \+dp needs dp_noise_multiplier \(sigma\) or dp_target_epsilon"),
    ("a budget one round exceeds", ["--fed_algorithm", "dp_fedavg", "--dp_noise_multiplier", "0.5",
                                    "--dp_target_epsilon", "0.5"],
     r"dp_target_epsilon: 0.5 is less than one round spends at dp_noise_multiplier=0.5"),
    ("client noise from the secret source", ["--fed_algorithm", "dp_fedavg", "--dp_secure_rng", "true"],
     r"dp_noise: 'client' with dp_secure_rng: a client sizes its share of the noise"),
    ("an unknown noise mode", ["--fed_algorithm", "dp_fedavg", "--dp_noise", "server"],
     r"dp_noise: must be one of \('central', 'client'\), got 'server'\."),
    ("a clip norm of 0", ["--fed_algorithm", "dp_fedavg", "--dp_clip_norm", "0"], r"dp_clip_norm: must be > 0.0"),
]


@pytest.mark.parametrize("case, argv, pattern", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_compositions_are_one_line_and_exit_status_2(tmp_path, capsys, case, argv, pattern):
    out = tmp_path / "run"
    capsys.readouterr()
    status = cli.main(["train", *DIGITS, *argv, "--output_dir", str(out)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == EXIT_BAD_INPUT, lines
    assert len(lines) == 1 and re.fullmatch(rf"hf-fedflat train: error: {pattern}.*", lines[0]), lines
    assert not (out / "final_model").exists()


# --- whole runs ----------------------------------------------------------------------------------------------
DP_RUN = dict(fed_algorithm="dp_fedsam", dp_noise_multiplier=1.0, num_rounds=4)


def test_epsilon_after_each_round_is_the_accountants(tmp_path):
    """6 clients, m = 3: q = 0.5; history.json and the model card carry the epsilon composed over the rounds run."""
    trainer, output = run(tmp_path, **DP_RUN)
    accountant = ClientLevelAccountant(1.0, 0.5, 1 / 60)
    spent = [r["dp_epsilon"] for r in json.loads((tmp_path / "history.json").read_text())]
    assert spent == pytest.approx([accountant.epsilon(t) for t in range(1, 5)], rel=1e-12)
    assert spent == sorted(spent) and spent[0] > 0
    card = (tmp_path / "final_model" / "README.md").read_text()
    assert f"({spent[-1]:.4g}, 0.01667)-differential privacy at client level after 4 rounds" in card


def test_a_budget_stops_the_run_before_the_round_that_would_exceed_it_and_saves_the_model(tmp_path, caplog):
    accountant = ClientLevelAccountant(1.0, 0.5, 1 / 60)
    budget = (accountant.epsilon(2) + accountant.epsilon(3)) / 2  # round 3 would exceed it
    trainer, output = run(tmp_path, dp_target_epsilon=budget, **DP_RUN)
    assert [r["round"] for r in output.history] == [1, 2]
    assert output.history[-1]["run_stopped"].startswith(f"dp_target_epsilon={budget:g}: round 3 would spend epsilon")
    assert (tmp_path / "final_model" / "model.safetensors").exists()
    assert "Stopped early: dp_target_epsilon" in caplog.text
    card = (tmp_path / "final_model" / "README.md").read_text()
    assert f"**Stopped after 2 of 4 rounds: dp_target_epsilon={budget:g}: round 3 would spend" in card


def test_resume_continues_the_accountant_and_the_seeded_noise(tmp_path):
    """Rounds 1-2, checkpoint, resume to round 4: the same epsilons and the same model as 4 rounds at once."""
    _, whole = run(tmp_path / "whole", **DP_RUN)
    run(tmp_path / "split", **{**DP_RUN, "num_rounds": 2}, save_every_n_rounds=2)
    _, resumed = run(tmp_path / "split", resume="latest", **DP_RUN)
    assert [r["dp_epsilon"] for r in resumed.history] == [r["dp_epsilon"] for r in whole.history]
    assert torch.equal(resumed.params, whole.params)


def test_client_noise_run_reproduces_and_differs_from_central(tmp_path):
    _, first = run(tmp_path / "a", **DP_RUN)
    _, again = run(tmp_path / "b", **DP_RUN)
    _, central = run(tmp_path / "c", dp_noise="central", **DP_RUN)
    assert torch.equal(first.params, again.params)
    assert not torch.equal(first.params, central.params)
