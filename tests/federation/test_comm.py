"""Two federated processes (`accelerate launch`, CPU config) give the same model as one process.

The first run composes LESAM (per-client old models), SCAFFOLD (c_i, c) and FedGH: every kind of state crosses
the exchange. The others carry the newer methods' state: FedGMT's duals and moving average under an ASAM client
(whose weight mask is built in each process), FedWMSAM's momentum, variates and weight behind FedGH, and
FedGloSS's sent weights, dual and pseudo-gradient with FedGH and SWA's cyclic learning rate and average; and
client-level DP, whose sampling and client noise every process draws alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers import REPO_ROOT, TEST_SCRIPTS

SCRIPT = TEST_SCRIPTS / "tiny_federated_run.py"
RUN_FLAGS = [
    "--num_clients", "6", "--clients_per_round", "5", "--num_rounds", "3",
    "--local_steps", "2", "--per_device_train_batch_size", "4", "--partition_scheme", "iid",
    "--learning_rate", "0.1", "--save_every_n_rounds", "1", "--disable_tqdm", "true",
]


def launch(config: str, output_dir: Path, extra=()) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "accelerate_configs" / config), "--main_process_port", "0",
        str(SCRIPT), "--output_dir", str(output_dir), *RUN_FLAGS, *extra,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


ALGORITHMS = {
    "fedlesam_s+fedgh": ["--fed_algorithm", "fedlesam_s+fedgh"],
    "fedgmt+asam": ["--fed_algorithm", "fedgmt", "--perturbation", "asam"],
    "fedwmsam+fedgh": ["--fed_algorithm", "fedwmsam+fedgh"],
    # FedGloSS (the weights sent differ from the server's), FedGH and SWA (the client learning rate, the model
    # evaluated) in one composition
    "fedgloss+fedgh+swa": ["--fed_algorithm", "fedgloss+fedgh+swa", "--swa_start_fraction", "0.25",
                           "--swa_cycle_rounds", "2", "--rho_warmup_rounds", "3", "--rho_start", "0.01",
                           "--fedgloss_rho", "0.1", "--clients_per_round", "3"],
    # client-level DP: Poisson sampling on every process, each client's noise drawn where it trains
    "fedlesam+dp": ["--fed_algorithm", "fedlesam+dp", "--dp_noise", "client", "--dp_noise_multiplier", "1.0",
                    "--dp_clip_norm", "0.5"],
}


#: the one 2-process run of the default suite (the richest composition); the others run with -m slow
DEFAULT_SUITE = "fedgloss+fedgh+swa"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", [name if name == DEFAULT_SUITE else pytest.param(name, marks=pytest.mark.slow)
                                       for name in ALGORITHMS])
def test_two_processes_equal_one_process(tmp_path, algorithm):
    launch("cpu_1proc.yaml", tmp_path / "one", ALGORITHMS[algorithm])
    launch("cpu_2proc.yaml", tmp_path / "two", ALGORITHMS[algorithm])
    one = load_file(str(tmp_path / "one" / "final_params.safetensors"))["params"]
    two = load_file(str(tmp_path / "two" / "final_params.safetensors"))["params"]
    assert (one - two).abs().max().item() <= 1e-5
    history_one = json.loads((tmp_path / "one" / "history.json").read_text())
    history_two = json.loads((tmp_path / "two" / "history.json").read_text())
    assert [r["clients"] for r in history_one] == [r["clients"] for r in history_two]
    assert [r["learning_rate"] for r in history_one] == [r["learning_rate"] for r in history_two]
    assert [r["eval_accuracy"] for r in history_one] == pytest.approx([r["eval_accuracy"] for r in history_two])
    # SCAFFOLD's c_i and LESAM's w_old_i made the round trip through the exchange and the store
    assert list((tmp_path / "two" / "checkpoints" / "round-3" / "client_states").iterdir())
