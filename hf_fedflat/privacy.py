"""The privacy accountant of a run whose server rule releases a noised mean (``+dp``, see docs/privacy.md).

The mechanism of one round is the Poisson-sampled Gaussian (every client taking part with probability ``q``, the sum
of the clipped updates moving by at most ``C`` when one client is added or removed, noise ``N(0, sigma^2 C^2)``);
the rounds compose. Google's ``dp-accounting`` does the accounting: the Renyi-DP accountant (Mironov, Talwar and
Zhang 2019, "Renyi Differential Privacy of the Sampled Gaussian Mechanism"), at the integer orders
:data:`RDP_ORDERS`, converted to ``(epsilon, delta)`` by the library. Nothing is kept between rounds: the epsilon
after ``T`` rounds is the composition of ``T`` rounds, recomputed from ``(sigma, q, delta, T)``, so a resumed run
continues where its checkpoint's round count left it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .field_checks import fail

__all__ = ["ACCOUNTANT", "NEIGHBOURING_RELATION", "RDP_ORDERS", "ClientLevelAccountant", "accountant_for",
           "settle_privacy"]

logger = logging.getLogger(__name__)

#: integer Renyi orders: exact for the sampled Gaussian (the library's fractional orders may fail to converge)
RDP_ORDERS = tuple(range(2, 65)) + (80, 96, 128, 192, 256, 384, 512)
ACCOUNTANT = "dp-accounting RDP (sampled Gaussian, integer orders 2-512)"
NEIGHBOURING_RELATION = "add or remove one client (all of its data)"


@dataclass(frozen=True)
class ClientLevelAccountant:
    """``epsilon`` after a number of rounds of the Poisson-sampled Gaussian mechanism at noise multiplier ``sigma``,
    sampling rate ``q`` and ``delta``."""

    noise_multiplier: float
    sampling_rate: float
    delta: float

    def _event(self, rounds: int):
        from dp_accounting import dp_event

        one_round = dp_event.PoissonSampledDpEvent(self.sampling_rate, dp_event.GaussianDpEvent(self.noise_multiplier))
        return dp_event.SelfComposedDpEvent(one_round, int(rounds))

    def epsilon(self, rounds: int) -> float:
        """The epsilon spent after ``rounds`` rounds (0 for none)."""
        if rounds <= 0:
            return 0.0
        from dp_accounting import rdp

        accountant = rdp.RdpAccountant(list(RDP_ORDERS))
        accountant.compose(self._event(rounds))
        return float(accountant.get_epsilon(self.delta))

    def rounds_within(self, target_epsilon: float, max_rounds: int) -> int:
        """The most rounds, at most ``max_rounds``, whose epsilon stays within ``target_epsilon`` (epsilon grows with
        the rounds: a bisection)."""
        if self.epsilon(max_rounds) <= target_epsilon:
            return max_rounds
        low, high = 0, max_rounds  # epsilon(low) <= target < epsilon(high)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.epsilon(middle) <= target_epsilon else (low, middle)
        return low

    @staticmethod
    def calibrate(target_epsilon: float, sampling_rate: float, rounds: int, delta: float) -> float:
        """The smallest noise multiplier (to 1e-4) whose ``rounds`` rounds spend at most ``target_epsilon``."""
        from dp_accounting import mechanism_calibration, rdp

        def event(sigma: float):
            return ClientLevelAccountant(sigma, sampling_rate, delta)._event(rounds)

        return float(mechanism_calibration.calibrate_dp_mechanism(
            lambda: rdp.RdpAccountant(list(RDP_ORDERS)), event, target_epsilon, delta,
            mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4))


def accountant_for(mechanism: dict[str, Any] | None) -> ClientLevelAccountant | None:
    """The accountant of a server rule's ``privacy_mechanism()`` (None: no privacy claimed, no accountant)."""
    if not mechanism:
        return None
    return ClientLevelAccountant(float(mechanism["noise_multiplier"]), float(mechanism["sampling_rate"]),
                                 float(mechanism["delta"]))


def settle_privacy(args) -> None:
    """Before round 1, for a ``FedTrainingArguments`` whose server rule releases a noised mean: fill in ``dp_delta``
    (``1/(10 num_clients)`` when unset), calibrate ``dp_noise_multiplier`` to ``dp_target_epsilon`` over
    ``num_rounds`` rounds when it is unset (or only a preset's default), and refuse (``ConfigError``) a budget that not even one round fits."""
    from .algorithms.composed import build_server_rule
    from .algorithms.registry import AGGREGATOR_PLUGINS, split_plugins

    if not any(AGGREGATOR_PLUGINS[name].capabilities.noised_release
               for name in split_plugins(args.aggregator_name)[1]):
        return  # (only a plug-in releases noise: no rule is built for the others)
    rule = build_server_rule(args.aggregator_name, args)
    mechanism = rule.privacy_mechanism()
    defaulted = set(getattr(args, "_defaulted_fields", ()))
    if args.dp_delta is None:
        args.dp_delta = mechanism["delta"]
        defaulted.add("dp_delta")
    target, rate = args.dp_target_epsilon, mechanism["sampling_rate"]
    # a preset's sigma gives way to a budget the user set: sigma is calibrated to it
    if args.dp_noise_multiplier is None or ("dp_noise_multiplier" in defaulted and target is not None):
        if target is None:
            fail("dp_noise_multiplier", "+dp needs dp_noise_multiplier (sigma) or dp_target_epsilon (sigma is then "
                 "calibrated to it); give one.")
        args.dp_noise_multiplier = ClientLevelAccountant.calibrate(target, rate, args.num_rounds, args.dp_delta)
        defaulted.add("dp_noise_multiplier")
        logger.info("dp_noise_multiplier: calibrated to %.4f for epsilon %g at delta %g over %d rounds (q = %g).",
                    args.dp_noise_multiplier, target, args.dp_delta, args.num_rounds, rate)
    elif target is not None:
        first = ClientLevelAccountant(args.dp_noise_multiplier, rate, args.dp_delta).epsilon(1)
        if first > target:
            fail("dp_target_epsilon", f"{target} is less than one round spends at dp_noise_multiplier="
                 f"{args.dp_noise_multiplier} (epsilon {first:.4g} at delta {args.dp_delta:g}); raise it, raise "
                 "dp_noise_multiplier, or leave dp_noise_multiplier unset to calibrate it.")
    args._defaulted_fields = tuple(sorted(defaulted))
