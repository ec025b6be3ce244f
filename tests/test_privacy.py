"""The accountant of client-level DP (``hf_fedflat.privacy``): epsilon against a second accountant (Opacus's RDP,
within 1%), against the sampled Gaussian's Renyi divergence computed here at integer orders (Mironov, Talwar and
Zhang 2019, Sec. 3.3) with the library's conversion, and a published value reproduced; the calibration of sigma to
a budget, the rounds a budget allows, and the settings a ``+dp`` run fills in."""

from __future__ import annotations

import math

import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp

from hf_fedflat import FedTrainingArguments
from hf_fedflat.privacy import RDP_ORDERS, ClientLevelAccountant

#: (q, sigma, rounds, delta): DP-FedSAM's set-up (50 of 500 clients, sigma 0.95, 200 rounds), DP-FedAvg-like
#: cross-device rates, a small and a full participation
SETTINGS = [(0.1, 0.95, 200, 1 / 500), (0.01, 1.1, 1000, 1e-5), (0.3, 2.0, 50, 1e-3), (1.0, 5.0, 20, 1e-3)]


def log_a(q: float, sigma: float, alpha: int) -> float:
    """``log A_alpha`` of the Poisson-sampled Gaussian at integer ``alpha``: ``log sum_k C(alpha, k) (1-q)^(alpha-k)
    q^k exp((k^2 - k) / (2 sigma^2))`` (Mironov, Talwar, Zhang 2019, Sec. 3.3), in log space."""
    terms = [math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
             + ((alpha - k) * math.log1p(-q) if q < 1 else (0.0 if k == alpha else -math.inf))
             + k * math.log(q) + (k * k - k) / (2 * sigma**2) for k in range(alpha + 1)]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def epsilon_by_hand(q: float, sigma: float, rounds: int, delta: float) -> float:
    """``min_alpha rdp + log(1 - 1/alpha) - log(delta alpha)/(alpha - 1)``, rdp = ``rounds * log A_alpha/(alpha-1)``
    (the conversion of Balle et al. 2020, Prop. 12 / Canonne et al. 2020, which dp-accounting uses)."""
    return max(0.0, min(rounds * log_a(q, sigma, a) / (a - 1) + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
                        for a in RDP_ORDERS))


@pytest.mark.parametrize("q, sigma, rounds, delta", SETTINGS)
def test_epsilon_equals_the_sampled_gaussians_divergence_computed_by_hand(q, sigma, rounds, delta):
    assert ClientLevelAccountant(sigma, q, delta).epsilon(rounds) == pytest.approx(
        epsilon_by_hand(q, sigma, rounds, delta), rel=1e-6)


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")  # Opacus's own orders, compared below
@pytest.mark.parametrize("q, sigma, rounds, delta", SETTINGS)
def test_two_accountants_agree_within_one_percent(q, sigma, rounds, delta):
    """Opacus's RDP accountant against dp-accounting's, at the same (integer) orders; Opacus's own orders, fractional
    ones among them, give a smaller epsilon by at most 5% (integer orders are the price of exact divergences)."""
    opacus = RDPAccountant()
    opacus.history = [(sigma, q, rounds)]
    ours = ClientLevelAccountant(sigma, q, delta).epsilon(rounds)
    assert ours == pytest.approx(opacus.get_epsilon(delta, alphas=list(RDP_ORDERS)), rel=0.01)
    assert opacus.get_epsilon(delta) <= ours <= 1.05 * opacus.get_epsilon(delta)


def test_a_published_value_is_reproduced():
    """Bu, Dong, Long, Su, "Deep Learning with Gaussian Differential Privacy", Harvard Data Science Review 2020,
    Fig. 4: DP-SGD on MNIST at q = 256/60000, sigma = 0.7, 70 epochs (16,406 steps) is (8.68, 1e-5)-DP by the moments
    accountant (RDP with the conversion epsilon = rdp + log(1/delta)/(alpha - 1) at TF Privacy's orders). The same
    divergence with the tighter conversion our accountant uses gives a smaller epsilon."""
    q, sigma, steps, delta = 256 / 60000, 0.7, 70 * 60000 // 256, 1e-5
    orders = [1 + x / 10 for x in range(1, 100)] + list(range(12, 64))
    rdp = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    moments = min(r + math.log(1 / delta) / (a - 1) for a, r in zip(orders, rdp))
    assert round(moments, 2) == 8.68
    assert ClientLevelAccountant(sigma, q, delta).epsilon(steps) < moments


def test_calibration_gives_the_smallest_sigma_within_the_budget():
    q, rounds, delta = 0.1, 50, 1e-3
    for budget in (2.0, 4.0, 8.0):
        sigma = ClientLevelAccountant.calibrate(budget, q, rounds, delta)
        assert ClientLevelAccountant(sigma, q, delta).epsilon(rounds) <= budget
        assert ClientLevelAccountant(sigma - 1e-3, q, delta).epsilon(rounds) > budget


def test_rounds_within_a_budget():
    accountant = ClientLevelAccountant(1.0, 0.2, 1e-3)
    spent = [accountant.epsilon(t) for t in range(0, 31)]
    assert spent[0] == 0.0 and spent == sorted(spent)
    assert accountant.rounds_within(spent[12], 30) == 12
    assert accountant.rounds_within((spent[12] + spent[13]) / 2, 30) == 12
    assert accountant.rounds_within(spent[30], 30) == 30
    assert accountant.rounds_within(spent[1] / 2, 30) == 0


def test_a_budget_calibrates_sigma_and_delta_defaults_below_one_over_n(tmp_path):
    """A preset's sigma gives way to a budget the user sets; sigma given with a budget is kept (the budget then
    stops the run); delta unset is 1/(10 N)."""
    common = dict(output_dir=str(tmp_path), fed_algorithm="dp_fedsam", num_clients=200, clients_per_round=20,
                  num_rounds=40)
    preset = FedTrainingArguments(**common)
    assert (preset.dp_noise_multiplier, preset.dp_delta) == (0.95, 1 / 2000)
    budget = FedTrainingArguments(**common, dp_target_epsilon=3.0)
    assert budget.dp_noise_multiplier == pytest.approx(ClientLevelAccountant.calibrate(3.0, 0.1, 40, 1 / 2000))
    assert ClientLevelAccountant(budget.dp_noise_multiplier, 0.1, 1 / 2000).epsilon(40) <= 3.0
    kept = FedTrainingArguments(**common, dp_target_epsilon=3.0, dp_noise_multiplier=0.95)
    assert kept.dp_noise_multiplier == 0.95
    other = budget.with_algorithm("dp_fedavg", num_rounds=80)  # recalibrated for the copy's rounds
    assert other.dp_noise_multiplier > budget.dp_noise_multiplier
