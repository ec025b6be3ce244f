"""Client-level differential privacy in front of any server rule that reads only the mean update: ``<aggregator>+dp``,
``--fed_algorithm fedlesam+dp``; the presets ``dp_fedavg`` and ``dp_fedsam``.

References: McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018
(DP-FedAvg: the server clips and adds the noise); Shi, Liu, Wei, Shen, Wang, Tao, "Make Landscape Flatter in
Differentially Private Federated Learning", CVPR 2023 (DP-FedSAM, Algorithm 1: each client clips and adds its share
of the noise). The accountant is ``hf_fedflat.privacy`` (docs/privacy.md says what the guarantee covers).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from ..algorithms.base import (
    EPS, Aggregator, AggregatorPlugin, Capabilities, ClientUpdate, PieceConfig, StateDict, Tensor, check_choice,
    check_number, fail, global_norm, hyperparameter, register_aggregator_plugin,
)

CENTRAL, CLIENT = "central", "client"
DP_NOISE_MODES = (CENTRAL, CLIENT)
#: the plug-in's own key in the aggregator state, beside the rule's behind it: the round its noise is drawn for
DP_KEYS = ("dp_round",)


@dataclass
class DPConfig(PieceConfig):
    dp_clip_norm: float = hyperparameter(
        1.0, "Client-level DP: C, each client's whole update is clipped to L2 norm C (one norm over all the "
        "trainable parameters, never per tensor).")
    dp_noise_multiplier: float | None = hyperparameter(
        None, "Client-level DP: sigma, the noise's standard deviation over C on the sum of the clipped updates (the "
        "mean carries sigma*C/m, m = clients_per_round). Unset: calibrated from dp_target_epsilon before round 1.")
    dp_target_epsilon: float | None = hyperparameter(
        None, "Client-level DP: the epsilon budget at dp_delta. With dp_noise_multiplier unset, sigma is calibrated "
        "so that num_rounds rounds spend it; with both set, the run stops, saving its model, before the round that "
        "would exceed it.")
    dp_delta: float | None = hyperparameter(
        None, "Client-level DP: delta of the (epsilon, delta) guarantee. Unset: 1/(10 num_clients), below "
        "1/num_clients.")
    dp_noise: str = hyperparameter(
        CENTRAL, "Client-level DP: where the noise is added: 'central' (DP-FedAvg: the server clips each update and "
        "adds N(0, sigma^2 C^2) to their sum) or 'client' (DP-FedSAM: each client clips its update and adds "
        "N(0, sigma^2 C^2 / max(n_t, m)), n_t the clients sampled, before it leaves the client; the server "
        "averages).")
    dp_secure_rng: bool = hyperparameter(
        False, "Client-level DP: draw the noise and the clients' sampling from the operating system's cryptographic "
        "source (os.urandom) instead of generators seeded by (seed, round, client), for deployments: anyone who "
        "knows the seed can recompute seeded noise. Runs then do not reproduce bit for bit.")

    def validate(self) -> None:
        check_number("dp_clip_norm", self.dp_clip_norm, low=0.0, low_open=True)
        if self.dp_noise_multiplier is not None:
            check_number("dp_noise_multiplier", self.dp_noise_multiplier, low=0.0, low_open=True)
        if self.dp_target_epsilon is not None:
            check_number("dp_target_epsilon", self.dp_target_epsilon, low=0.0, low_open=True)
        if self.dp_delta is not None:
            check_number("dp_delta", self.dp_delta, low=0.0, high=1.0, low_open=True, high_open=True)
        check_choice("dp_noise", self.dp_noise, DP_NOISE_MODES)
        if not isinstance(self.dp_secure_rng, bool):
            fail("dp_secure_rng", f"must be true or false, got {self.dp_secure_rng!r}.")


def default_delta(num_clients: int) -> float:
    """``1 / (10 N)``: delta below ``1/N``, the chance of one client's guarantee failing outright."""
    return 1.0 / (10 * num_clients)


def clip_update(delta: Tensor, clip_norm: float) -> Tensor:
    """``Delta * min(1, C / ||Delta||_2)``, one L2 norm over the whole update (a new tensor)."""
    factor = torch.clamp(clip_norm / torch.clamp(global_norm(delta), min=EPS), max=1.0)
    return delta * factor.to(delta.dtype)


def stream_seed(*parts: Any) -> int:
    """A 63-bit seed from ``parts`` (SHA-256 of their ``repr``): the same on every process and Python version."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


def secure_uniform(numel: int) -> Tensor:
    """``numel`` uniform draws in [0, 1) (float64) from ``os.urandom``: 53 random bits each."""
    words = torch.frombuffer(bytearray(os.urandom(8 * numel)), dtype=torch.int64)
    # the sign bit cleared (an arithmetic shift of a negative word stays negative), then 63 - 10 = 53 bits kept
    return torch.bitwise_right_shift(torch.bitwise_and(words, 0x7FFFFFFFFFFFFFFF), 10).double().mul_(2.0 ** -53)


def secure_standard_normal(numel: int) -> Tensor:
    """``numel`` draws of N(0, 1) (float64) from the OS's cryptographic source: :func:`secure_uniform` through the
    Box-Muller transform."""
    pairs = (numel + 1) // 2
    uniform = secure_uniform(2 * pairs).view(2, pairs)
    radius = torch.sqrt(-2.0 * torch.log1p(-uniform[0]))  # 1 - u in (0, 1]: the log is finite
    angle = 2.0 * math.pi * uniform[1]
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:numel]


def gaussian_noise(numel: int, std: float, seed: int | None, dtype: torch.dtype = torch.float32) -> Tensor:
    """N(0, std^2) per coordinate on the CPU: from ``torch.Generator().manual_seed(seed)``, or from
    :func:`secure_standard_normal` when ``seed`` is None."""
    if seed is None:
        return secure_standard_normal(numel).mul_(std).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator, dtype=dtype).mul_(std)


def poisson_sample(num_clients: int, rate: float, seed: int | None) -> list[int]:
    """Every client independently with probability ``rate`` (sorted ids); from a generator seeded by ``seed``, or
    from the OS's cryptographic source when ``seed`` is None."""
    if seed is None:
        uniform = secure_uniform(num_clients)
    else:
        uniform = torch.rand(num_clients, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.nonzero(uniform < rate).flatten().tolist()


def _given_field(args: Any) -> str:
    """The field that named the aggregator: ``aggregator`` when given, else ``fed_algorithm``."""
    return "aggregator" if getattr(args, "aggregator", None) is not None else "fed_algorithm"


@register_aggregator_plugin
class ClientLevelDPAggregator(AggregatorPlugin):
    """Client-level (epsilon, delta)-DP of the sequence of global models, add or remove one client.

    Each round samples every client independently with probability ``q = m/N`` (Poisson, ``m = clients_per_round``;
    the sampling the accountant assumes), and releases the mean with the fixed denominator ``m``:

    * ``central``: ``(sum_i clip(Delta_i) + N(0, sigma^2 C^2 I)) / m``, the clipping and the noise on the server;
    * ``client``: each client sends ``clip(Delta_i) + N(0, sigma^2 C^2 / k_t I)`` (:meth:`release_update`, in the
      client's own code path), ``k_t = max(n_t, m)`` for the ``n_t`` clients sampled; the server adds the shares
      that did not arrive (fewer than ``m`` sampled, or clients excluded) and divides the sum by ``m``.

    ``clip(Delta) = Delta * min(1, C/||Delta||)``, one norm over the whole update. Either way the sum carries
    exactly ``N(0, sigma^2 C^2 I)`` and moves by at most ``C`` when one client is added or removed. The rule behind
    receives that release as the round's one update, with weight 1: it must read the updates only through their
    weighted sum (``capabilities.linear_in_weighted_delta``: mean, FedAdam), so everything it does is
    post-processing. The noise is drawn from generators seeded by ``(seed, round[, client])``, or from the OS's
    cryptographic source (``dp_secure_rng``).

    State: the base rule's and ``{"dp_round": t}``, the round the server's noise is drawn for.
    """

    plugin = "dp"
    config_class = DPConfig
    run_settings = ("seed", "num_clients", "num_clients_per_round")
    capabilities = Capabilities(noised_release=True)

    def __init__(self, base: Aggregator, config: DPConfig | None = None, seed: int = 0, num_clients: int = 1,
                 num_clients_per_round: int = 1):
        super().__init__(base, config)
        self.seed, self.num_clients, self.clients_per_round = int(seed), int(num_clients), int(num_clients_per_round)

    # --- the mechanism -----------------------------------------------------------------------------------
    @property
    def sampling_rate(self) -> float:
        return self.clients_per_round / self.num_clients

    @property
    def delta(self) -> float:
        return self.config.dp_delta if self.config.dp_delta is not None else default_delta(self.num_clients)

    def _sigma(self) -> float:
        sigma = self.config.dp_noise_multiplier
        if sigma is None:
            raise ValueError("dp_noise_multiplier: unset; give it, or dp_target_epsilon to calibrate it "
                             "(FedTrainingArguments does so before round 1).")
        return float(sigma)

    def _noise(self, numel: int, std: float, dtype: torch.dtype, *stream: Any) -> Tensor:
        seed = None if self.config.dp_secure_rng else stream_seed(self.seed, "dp", *stream)
        return gaussian_noise(numel, std, seed, torch.float64 if dtype == torch.float64 else torch.float32)

    def privacy_mechanism(self) -> dict[str, Any]:
        return {"mechanism": "Poisson-sampled Gaussian, add or remove one client", "noise": self.config.dp_noise,
                "clip_norm": self.config.dp_clip_norm, "noise_multiplier": self.config.dp_noise_multiplier,
                "sampling_rate": self.sampling_rate, "clients_per_round": self.clients_per_round,
                "num_clients": self.num_clients, "delta": self.delta,
                "target_epsilon": self.config.dp_target_epsilon, "secure_rng": self.config.dp_secure_rng}

    def sample_clients(self, round_index: int, num_clients: int, clients_per_round: int, seed: int) -> list[int]:
        stream = None if self.config.dp_secure_rng else stream_seed(seed, "dp-sample", round_index)
        return poisson_sample(num_clients, clients_per_round / num_clients, stream)

    def noise_shares(self, round_index: int) -> int:
        """``k_t = max(n_t, m)``, ``n_t`` the clients round ``round_index`` samples: client mode splits the sum's
        noise into ``k_t`` shares of ``sigma^2 C^2 / k_t`` (the clients' and the server's for the missing ones), so
        that the sum always carries exactly ``N(0, sigma^2 C^2)``: the noise's size does not tell how many clients
        took part. ``n_t`` is recomputed from the seeded sampling, as every process does."""
        sampled = self.sample_clients(round_index, self.num_clients, self.clients_per_round, self.seed)
        return max(len(sampled), self.clients_per_round)

    def release_update(self, round_index: int, client_id: int, delta: Tensor) -> Tensor:
        delta = self.base.release_update(round_index, client_id, delta)
        if self.config.dp_noise != CLIENT:
            return delta
        std = self._sigma() * self.config.dp_clip_norm / math.sqrt(self.noise_shares(round_index))
        noise = self._noise(delta.numel(), std, delta.dtype, "client", round_index, client_id)
        return clip_update(delta, self.config.dp_clip_norm).add_(noise.to(device=delta.device, dtype=delta.dtype))

    # --- the server's half ---------------------------------------------------------------------------------
    def init_state(self, params: Tensor) -> StateDict:
        return {**self.base.init_state(params), "dp_round": torch.zeros((), dtype=torch.int64)}

    @staticmethod
    def _split(state: StateDict) -> tuple[StateDict, StateDict]:
        """``(the base rule's state, this plug-in's)``."""
        return {k: v for k, v in state.items() if k not in DP_KEYS}, {k: state[k] for k in DP_KEYS if k in state}

    def begin_round(self, round_index: int, state: StateDict) -> StateDict:
        base_state, _ = self._split(state)
        return {**self.base.begin_round(round_index, base_state),
                "dp_round": torch.tensor(round_index, dtype=torch.int64)}

    def aggregate(
        self, params: Tensor, updates: list[ClientUpdate], weights: Tensor | None, state: StateDict
    ) -> tuple[Tensor, StateDict]:
        base_state, own = self._split(state)
        round_index, m, clip = int(own.get("dp_round", 0)), self.clients_per_round, self.config.dp_clip_norm
        total = torch.zeros_like(params)
        for update in updates:  # the same order on every run: the gathered order
            total.add_(clip_update(update.delta, clip) if self.config.dp_noise == CENTRAL else update.delta)
        # the part of sigma^2 C^2 the sum still lacks: all of it (central), or the shares that did not arrive (client)
        if self.config.dp_noise == CENTRAL:
            shares = 1.0
        else:
            expected = self.noise_shares(round_index)
            shares = max(0, expected - len(updates)) / expected
        if shares > 0:
            std = self._sigma() * clip * math.sqrt(shares)
            total.add_(self._noise(total.numel(), std, total.dtype, "server", round_index).to(total.device))
        release = ClientUpdate(client_id=-1, num_samples=sum(u.num_samples for u in updates),
                               num_steps=max((u.num_steps for u in updates), default=0), train_loss=0.0,
                               delta=total.div_(m))
        new_params, base_state = self.base.aggregate(
            params, [release], torch.ones(1, dtype=torch.float64), base_state)
        return new_params, {**base_state, **own}

    def broadcast_weights(self, round_index: int, params: Tensor, state: StateDict) -> Tensor:
        return self.base.broadcast_weights(round_index, params, self._split(state)[0])

    def end_round(self, state, summary):
        base_state, own = self._split(state)
        return {**self.base.end_round(base_state, summary), **own}

    def evaluation_weights(self, params: Tensor, state: StateDict) -> Tensor:
        return self.base.evaluation_weights(params, self._split(state)[0])

    # --- what it refuses ------------------------------------------------------------------------------------
    def check_composition(self, args: Any, client_pieces: list[type]) -> None:
        if getattr(args, "aggregation_weights", "uniform") != "uniform":
            fail("aggregation_weights", "+dp averages the clipped updates with uniform weights over a fixed "
                 "denominator (clients_per_round): a sample-weighted mean's sensitivity is not bounded by the clip "
                 "norm; set --aggregation_weights uniform.")
        if getattr(args, "batchnorm_buffers", None) == "average":
            fail("batchnorm_buffers", "'average' sends each client's BatchNorm statistics beside its update, and "
                 "+dp neither clips nor noises them; use a model without BatchNorm (GroupNorm: resnet18_gn).")
        if not self.base.capabilities.linear_in_weighted_delta:
            fail(_given_field(args), f"+dp releases only the noised mean of the clipped updates, but the rule "
                 f"behind it, {self.base.name}, reads each client's update (or its steps or messages), not only "
                 "their mean, so its output would not be covered by the noise; put +dp behind a rule that reads "
                 "only the mean (mean, fedadam: presets fedavg, fedsam, fedlesam, fedgam, fedasam, fedswa, ...).")
        readers = [piece.name for piece in client_pieces if piece.server_reads_updates]
        if readers:
            fail(_given_field(args), f"the server half of {', '.join(readers)} reads each client's upload (its "
                 "update, steps or messages) beside the noised mean, which +dp does not protect; pick pieces "
                 "without one (perturbation none, sam, asam, lesam, gam; corrections prox, fedup, moon, ...).")
        if self.config.dp_noise == CLIENT and self.config.dp_secure_rng:
            fail("dp_noise", "'client' with dp_secure_rng: a client sizes its share of the noise by the number of "
                 "clients the round sampled, which the server draws in secret then; use dp_noise central with "
                 "dp_secure_rng, or seeded noise for a simulation.")
        if self.config.dp_noise_multiplier is None and self.config.dp_target_epsilon is None:
            fail("dp_noise_multiplier", "+dp needs dp_noise_multiplier (sigma) or dp_target_epsilon (sigma is then "
                 "calibrated to it); give one.")
        self.base.check_composition(args, client_pieces)
