"""What client-level DP (``+dp``) adds to a round, piece by piece (CPU).

    python benchmarks/dp_cost.py [--numel 581642] [--clients 10] [--repeats 30] [--output benchmarks/dp_cost.json]

Times, each the median of ``--repeats`` (after one warm-up), on flat float32 vectors of ``--numel`` entries (default:
the 0.58M-parameter ``small_cnn`` of ``benchmarks/run.py``):

- ``client_release_ms``: one client's clip and noise (``release_update`` in client mode), seeded generator;
- ``noise_seeded_ms`` / ``noise_secure_ms``: the noise vector alone, from the seeded generator or from the OS's
  cryptographic source (``--dp_secure_rng``, central noise);
- ``server_release_central_ms``: the server's clip of ``--clients`` updates, their sum, the noise and the division
  (``aggregate`` in central mode, the mean rule behind it);
- ``server_mean_ms``: the mean rule alone on the same updates (what a round without DP does there);
- ``epsilon_ms``: the accountant's epsilon after 200 rounds (computed once per round);
- ``calibration_ms``: calibrating sigma to a budget (once per run).

The whole round's time is the sweep's ``s/round`` (``sweeps/measure_dp_digits.yaml``); these say where the
difference goes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hf_fedflat import FedTrainingArguments, build_algorithm
from hf_fedflat.aggregators.dp import gaussian_noise
from hf_fedflat.algorithms import ClientContext, ClientUpdate
from hf_fedflat.privacy import ClientLevelAccountant


def median_ms(function, repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=581642)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--output", default=None)
    options = parser.parse_args(argv)
    torch.set_num_threads(1)

    def algorithm(name: str, **fields):
        args = FedTrainingArguments(output_dir="/tmp/dp_cost", use_cpu=True, num_clients=100,
                                    clients_per_round=options.clients, fed_algorithm=name,
                                    aggregation_weights="uniform", **fields)
        return build_algorithm(args)

    dp = {"dp_noise_multiplier": 1.0, "dp_clip_norm": 0.2}
    client = algorithm("fedavg+dp", dp_noise="client", **dp)
    central, plain = algorithm("fedavg+dp", **dp), algorithm("fedavg")
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(options.numel, generator=generator)
    updates = [ClientUpdate(k, 10, 5, 0.0, 0.01 * torch.randn(options.numel, generator=generator))
               for k in range(options.clients)]
    weights = torch.full((options.clients,), 1 / options.clients, dtype=torch.float64)
    ctx = ClientContext(0, 3, w, {}, {}, 0.05, 10)
    central_state, plain_state = central.init_server_state(w), plain.init_server_state(w)
    accountant = ClientLevelAccountant(1.0, 0.1, 1e-3)
    results = {
        "numel": options.numel, "clients": options.clients, "threads": torch.get_num_threads(),
        "client_release_ms": median_ms(lambda: client.release_update(ctx, updates[0].delta), options.repeats),
        "noise_seeded_ms": median_ms(lambda: gaussian_noise(options.numel, 1.0, 7), options.repeats),
        "noise_secure_ms": median_ms(lambda: gaussian_noise(options.numel, 1.0, None), options.repeats),
        "server_release_central_ms": median_ms(
            lambda: central.server_step(3, w, updates, weights, central_state, 100), options.repeats),
        "server_mean_ms": median_ms(lambda: plain.server_step(3, w, updates, weights, plain_state, 100),
                                    options.repeats),
        "epsilon_ms": median_ms(lambda: accountant.epsilon(200), options.repeats),
        "calibration_ms": median_ms(lambda: ClientLevelAccountant.calibrate(4.0, 0.1, 200, 1e-3),
                                    max(3, options.repeats // 10)),
    }
    for key, value in results.items():
        print(f"{key:28s} {value:.3f}" if isinstance(value, float) else f"{key:28s} {value}")
    if options.output:
        with open(options.output, "w") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
