"""The quickstart job on a Flower deployment against the built-in loop: seconds per round and their ratio.

    python benchmarks/flower_deployment.py [--rounds 10] [--output benchmarks/flower_deployment.json]

The job: recipes/configs/quickstart_fedavg.yaml (digits at 16x16, the small CNN, Dir(0.3), SGD 0.05, batch 16, one
local epoch, evaluation every round) with one client per SuperNode: 3 clients, all 3 each round. The deployment is
``hf-fedflat flower-local``'s: a SuperLink and 3 SuperNodes on 127.0.0.1 (``hf_fedflat.flower.LocalFederation``), the
App written by ``hf-fedflat flower-app``; the built-in loop is ``hf-fedflat train`` of the same configuration. Both
run as processes, one after the other, and write their ``history.json``, whose ``round_seconds`` (from the start of a
round to its record) give the seconds per round; the first round is reported apart (the deployment's includes the
nodes' start: each node's worker builds the experiment then). The final weights of the two are compared too.
Writes the JSON report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parent / "recipes" / "configs" / "quickstart_fedavg.yaml"


def _history(output_dir: str) -> list[dict]:
    with open(os.path.join(output_dir, "history.json")) as f:
        return json.load(f)


def _cli(*arguments: str, env=None) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hf_fedflat.cli", *arguments], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _summary(output_dir: str, wall: float) -> dict:
    seconds = [r["round_seconds"] for r in _history(output_dir)]
    return {"wall_seconds": wall, "first_round_seconds": seconds[0],
            "seconds_per_round": statistics.median(seconds[1:]), "rounds": len(seconds),
            "final_eval_accuracy": _history(output_dir)[-1].get("eval_accuracy")}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--output", default=str(HERE / "flower_deployment.json"))
    args = parser.parse_args(argv)
    from hf_fedflat.flower.local import LocalFederation

    with tempfile.TemporaryDirectory(prefix="hf_fedflat_flower_bench_") as folder:
        config = yaml.safe_load(QUICKSTART.read_text())
        config.update(num_clients=3, clients_per_round=3, num_rounds=args.rounds, save_every_n_rounds=0,
                      report_to="none", disable_tqdm=True)
        path = os.path.join(folder, "run.yaml")
        Path(path).write_text(yaml.safe_dump(config))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        builtin = os.path.join(folder, "builtin")
        builtin_wall = _cli("train", "--config", path, "--output_dir", builtin, env=env)
        deployed = os.path.join(folder, "deployed")
        app = os.path.join(folder, "app")
        _cli("flower-app", "--config", path, "--output", app, "--output_dir", deployed, env=env)
        with LocalFederation(3, folder=os.path.join(folder, "federation"), output=lambda line: None) as federation:
            start = time.perf_counter()
            status = federation.run(app, timeout=3600)
            deployed_wall = time.perf_counter() - start
        if status != 0:
            raise SystemExit(f"the deployment failed (flwr run exited {status})")
        from safetensors.torch import load_file

        weights = [load_file(next(Path(d, "final_model").glob("*.safetensors"))) for d in (builtin, deployed)]
        report = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "job": f"quickstart_fedavg.yaml with 3 clients (one per SuperNode), all each round, {args.rounds} rounds",
            "builtin": _summary(builtin, builtin_wall), "deployment": _summary(deployed, deployed_wall),
            "bytes_per_round_per_node": _history(deployed)[-1]["node_bytes"],
            "same_final_weights": all(weights[0][k].equal(weights[1][k]) for k in weights[0]),
        }
        report["ratio_seconds_per_round"] = (report["deployment"]["seconds_per_round"]
                                             / report["builtin"]["seconds_per_round"])
        report["ratio_wall"] = report["deployment"]["wall_seconds"] / report["builtin"]["wall_seconds"]
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
