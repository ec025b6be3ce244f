"""``hf-fedflat``: train from a config file, compare runs, look at a partition.

    hf-fedflat train --config recipes/configs/quickstart_fedavg.yaml [--num_rounds 50 ...]
    hf-fedflat compare outputs/fedavg outputs/fedsam [--metric eval_accuracy] [--out_dir .]
    hf-fedflat partition --dataset digits --num_clients 20 --partition_scheme dirichlet \\
        --dirichlet_alpha 0.3 --plot partition.png
    hf-fedflat list
    hf-fedflat sweep --config sweeps/fedgam.yaml [--smoke]

``train`` takes every field of ``DataArguments``, ``ModelArguments`` and ``FedTrainingArguments`` as a
flag or as a key of the ``--config`` YAML/JSON file; flags override the file. Multi-process runs go
through accelerate as usual: ``accelerate launch -m hf_fedflat.cli train --config run.yaml``.
"""

from __future__ import annotations

import argparse
import csv
import glob
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .summary import summarize_run

__all__ = ["COMMANDS", "COMPARE_COLUMNS", "compare_main", "format_comparison", "list_main", "main", "partition_main",
           "sweep_main", "train_main"]


# -------------------------------------------------------------------------------------------------
# train
# -------------------------------------------------------------------------------------------------
def train_main(argv: Sequence[str]) -> int:
    from .experiment import run_experiment
    from .exit_codes import input_error_types, report_disk_full, report_input_error
    from ..federation.comm import init_federated_process_group
    from ..federation.outcome import EXIT_TRAINING_FAILED, RUN_STATUS_FILE, TrainingFailedError
    from .parsing import ConfigError, parse_train_args

    group = init_federated_process_group()  # before the arguments set up accelerate
    try:
        data_args, model_args, lora_args, args = parse_train_args(argv)
    except ConfigError as error:
        return report_input_error("hf-fedflat train", error)
    try:
        experiment, output = run_experiment(data_args, model_args, args, lora_args=lora_args)
    except TrainingFailedError as failed:  # the run did not train: no final model, a non-zero exit status
        if group.is_main:
            kept = getattr(failed.output, "final_model_dir", None)  # (fail_if_not_learned keeps it)
            print(f"\nTraining failed: {failed.reason}\nSee {os.path.join(args.output_dir, RUN_STATUS_FILE)} and "
                  f"history.json; {f'the final model is in {kept}' if kept else 'no final_model/ was written'}.",
                  file=sys.stderr)
        return EXIT_TRAINING_FAILED
    except input_error_types() as error:
        return report_input_error("hf-fedflat train", error)
    except Exception as error:  # a full disk: one line naming the file and the checkpoint to resume
        status = report_disk_full("hf-fedflat train", error)
        if status is None:
            raise
        return status
    if group.is_main:
        from ..hub.card import primary_metric

        # the metric the model card ranks by: entity F1 for token classification, perplexity for a causal LM
        metric = primary_metric(output.history, experiment.data.task)
        print(format_comparison([summarize_run(args.output_dir, metric).row(COMPARE_COLUMNS)]))
        print(f"\nFinal model and model card: {output.final_model_dir}")
    return 0


# -------------------------------------------------------------------------------------------------
# compare
# -------------------------------------------------------------------------------------------------
def _run_dirs(patterns: Sequence[str]) -> list[Path]:
    """Run folders from paths or glob patterns; a folder of runs stands for its runs."""
    found: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for match in matches:
            path = Path(match)
            if path.is_file() and path.name == "history.json":
                path = path.parent
            if (path / "history.json").is_file():
                found.append(path)
            elif path.is_dir():
                found += sorted(p.parent for p in path.glob("*/history.json"))
    unique: list[Path] = []
    for path in found:
        if path.resolve() not in {p.resolve() for p in unique}:
            unique.append(path)
    return unique


#: the columns of ``hf-fedflat compare`` (its CSV) and of the table ``hf-fedflat train`` prints
COMPARE_COLUMNS = ("run", "path", "algorithm", "rounds", "metric", "final", "best", "best_round", "seconds_per_round",
                   "wall_seconds")


def format_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of runs: rows of :data:`COMPARE_COLUMNS` (``summarize_run(run).row(COMPARE_COLUMNS)``)."""
    metric = rows[0]["metric"] if rows else "eval_accuracy"
    flagged = any(r.get("conventions") for r in rows)  # runs that differ in more than their methods
    lines = [f"| run | algorithm | rounds | final {metric} | best {metric} (round) | s/round | wall s |"
             + (" differs in (not the method) |" if flagged else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if flagged else "")]
    for r in rows:
        lines.append(f"| {r['run']} | {r['algorithm']} | {r['rounds']} | {r['final']:.4f} | "
                     f"{r['best']:.4f} ({r['best_round']}) | {r['seconds_per_round']:.2f} | {r['wall_seconds']:.1f} |"
                     + (f" {r.get('conventions') or '-'} |" if flagged else ""))
    return "\n".join(lines)


def compare_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="hf-fedflat compare",
                                     description="Compare runs by their history.json: table, PNG and CSV.")
    parser.add_argument("runs", nargs="+", help="Run folders (output_dir), glob patterns, or folders of runs.")
    parser.add_argument("--metric", default="eval_accuracy", help="History key to compare (default eval_accuracy).")
    parser.add_argument("--x", default="round", choices=("round", "wall_seconds"), help="x axis of the chart.")
    parser.add_argument("--out_dir", default=".", help="Where comparison.png / comparison.csv go (default: here).")
    parser.add_argument("--name", default="comparison", help="File name stem of the outputs.")
    options = parser.parse_args(list(argv))
    runs = _run_dirs(options.runs)
    if not runs:
        parser.error(f"runs: no history.json found under {', '.join(options.runs)}.")
    rows = [summarize_run(run, options.metric).row(COMPARE_COLUMNS) for run in runs]
    names = [row["run"] for row in rows]
    if len(set(names)) < len(names):  # same folder name in different places: show the paths
        for row in rows:
            row["run"] = row["path"]
    # runs made apart may differ in more than their methods (aggregation weights, learning rate, ...): flagged
    from .conventions import plan_alignment, recorded_conventions

    recorded = [recorded_conventions(row["run"], run) for row, run in zip(rows, runs)]
    report = plan_alignment([r for r in recorded if r is not None], "per_method")
    for row in rows:
        row["conventions"] = report.flag(row["run"])
    if report.mixed:
        print("\n".join(report.difference_lines()) + "\n")
    print(format_comparison(rows))
    from ..plots import plot_comparison

    out_dir = Path(options.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot_comparison({row["run"]: Path(row["path"]) for row in rows}, out_dir / f"{options.name}.png",
                          metric=options.metric, x=options.x)
    csv_path = out_dir / f"{options.name}.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nWrote {png} and {csv_path}")
    return 0


# -------------------------------------------------------------------------------------------------
# partition
# -------------------------------------------------------------------------------------------------
def partition_main(argv: Sequence[str]) -> int:
    from ..data import SCHEMES, partition_dataset, plot_partition_heatmap
    from ..data.arguments import DataArguments
    from ..data.catalog import list_datasets, load_data
    from ..models.arguments import ModelArguments

    parser = argparse.ArgumentParser(prog="hf-fedflat partition",
                                     description="Split a dataset into clients; print the summary, draw the heatmap.")
    parser.add_argument("--dataset", default="digits", help=f"Registered dataset ({', '.join(list_datasets())}).")
    parser.add_argument("--dataset_path", default=None, help="Hub name or local folder, for datasets that read one.")
    parser.add_argument("--data_dir", default=None, help="Local copy of a dataset in its own format (LEAF folders, ...).")
    parser.add_argument("--image_size", type=int, default=None, help="As train's --image_size (synthetic: 1).")
    parser.add_argument("--num_clients", type=int, default=20)
    parser.add_argument("--partition_scheme", default="dirichlet", choices=SCHEMES)
    parser.add_argument("--dirichlet_alpha", type=float, default=0.3)
    parser.add_argument("--classes_per_client", type=int, default=2)
    parser.add_argument("--min_partition_size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42, help="Partition seed (and the train/test split's).")
    parser.add_argument("--plot", default=None, help="Write the client x class heatmap to this PNG.")
    parser.add_argument("--json", default=None, help="Write the partition (indices and label counts) to this JSON.")
    options = parser.parse_args(list(argv))
    model_args = ModelArguments() if options.image_size is None else ModelArguments(image_size=options.image_size)
    data = load_data(DataArguments(dataset_name=options.dataset, dataset_path=options.dataset_path,
                                   data_dir=options.data_dir), model_args, options.seed)
    partition = data.partition  # a natural one (FEMNIST's writers, Shakespeare's roles, ...): what a run uses
    if partition is None:
        partition = partition_dataset(
            data.train, options.num_clients, options.partition_scheme, label_column=data.label_column,
            alpha=options.dirichlet_alpha, classes_per_client=options.classes_per_client,
            min_partition_size=options.min_partition_size, seed=options.seed,
        )
    else:
        print(f"{options.dataset} comes with its own partition ({partition.num_clients} clients); the partition "
              "flags do not apply.")
    print(partition.summary())
    if options.plot:
        print(f"Heatmap: {plot_partition_heatmap(partition, options.plot)}")
    if options.json:
        print(f"Partition: {partition.save_json(options.json)}")
    return 0


# -------------------------------------------------------------------------------------------------
def list_main(argv: Sequence[str]) -> int:
    from ..algorithms import get_preset, list_algorithms
    from ..data.catalog import list_datasets
    from ..models import available_models

    argparse.ArgumentParser(prog="hf-fedflat list", description="Algorithms, datasets and models.").parse_args(list(argv))
    print("algorithms:")
    for name in list_algorithms():
        print(f"  {name:<14} {get_preset(name).description}")
    print(f"datasets: {', '.join(list_datasets())}")
    print(f"models: {', '.join(available_models())}, or any timm model name")
    return 0


def sweep_main(argv: Sequence[str]) -> int:
    from .sweep import sweep_main as run

    return run(argv)


# -------------------------------------------------------------------------------------------------
# Flower
# -------------------------------------------------------------------------------------------------
def flower_app_main(argv: Sequence[str]) -> int:
    """``hf-fedflat flower-app --config run.yaml --output APP_DIR [--field value ...]``: the run as a Flower App."""
    from .exit_codes import input_error_types, report_input_error
    from .parsing import ConfigError, parse_train_args, read_config_file, split_config

    parser = argparse.ArgumentParser(
        prog="hf-fedflat flower-app",
        description="Write a Flower App (pyproject.toml and its package) whose ServerApp and ClientApp are "
                    "hf_fedflat's, with the run's configuration as the App's settings; then `flwr run APP_DIR "
                    "<federation>`, or `hf-fedflat flower-local --app APP_DIR --supernodes N`. Further "
                    "`--field value` flags of `hf-fedflat train` override the file.")
    parser.add_argument("--config", required=True, help="the run's YAML/JSON configuration (as hf-fedflat train)")
    parser.add_argument("--output", required=True, help="the App folder to write")
    parser.add_argument("--name", default=None, help="the App's name (default: the folder's name)")
    from ..flower.settings import DEPLOYMENT_DEFAULTS

    for name, default in DEPLOYMENT_DEFAULTS.items():
        parser.add_argument(f"--{name}", type=float, default=None,
                            help=f"(also a key of the config file; default {default:g}) " + {
                                "flower_reply_timeout": "seconds the ServerApp waits for a round's replies",
                                "flower_connect_timeout": "seconds the ServerApp waits, before round 1, for a node of "
                                                          "every client"}[name])
    known, rest = parser.parse_known_args(argv)
    try:
        from ..flower import require_flower

        require_flower()
        values = read_config_file(known.config)
        deployment = {k: values.pop(k) for k in DEPLOYMENT_DEFAULTS if k in values}
        deployment.update({k: getattr(known, k) for k in DEPLOYMENT_DEFAULTS if getattr(known, k) is not None})
        for key, value in deployment.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{key}: {value!r}; give a number of seconds >= 0.")
        _, flags = split_config(rest)
        # the configuration is checked now, as hf-fedflat train checks it (nothing loads or trains here)
        import tempfile

        import yaml

        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, os.path.basename(known.config) + ".yaml")
            with open(path, "w") as f:
                yaml.safe_dump(values, f)
            checked = parse_train_args(["--config", path, *flags])
        given = {a[2:].split("=", 1)[0] for a in flags if a.startswith("--")}
        for name in given:
            values[name] = _field_value(checked, name)
        from ..algorithms import build_algorithm

        if build_algorithm(checked[-1]).aggregator.capabilities.decentralized:
            raise ConfigError(f"fed_algorithm: {checked[-1].fed_algorithm!r} is decentralized (clients gossip with "
                              "neighbours, there is no server); a Flower deployment runs the server algorithms.")
        from ..flower import write_flower_app

        values.update(deployment)
        # relative paths mean what they mean to hf-fedflat train run here: relative to this working folder
        folder = write_flower_app(values, known.output, name=known.name, base_dir=os.getcwd())
    except RuntimeError as error:
        print(f"hf-fedflat flower-app: error: {error}", file=sys.stderr)
        return 2
    except input_error_types() as error:
        return report_input_error("hf-fedflat flower-app", error)
    print(f"Flower App written to {folder}\n  flwr run {folder} <federation>\n  "
          f"hf-fedflat flower-local --app {folder} --supernodes <clients>")
    return 0


def _field_value(parsed: tuple, name: str):
    for values in parsed:
        if hasattr(values, name):
            value = getattr(values, name)
            return value.value if hasattr(value, "value") and not isinstance(value, (int, float, str)) else value
    return None


def flower_local_main(argv: Sequence[str]) -> int:
    """``hf-fedflat flower-local --app APP_DIR --supernodes N``: a SuperLink and N SuperNodes on 127.0.0.1, the App
    run on them, every process stopped at the end."""
    parser = argparse.ArgumentParser(
        prog="hf-fedflat flower-local",
        description="Run a Flower App on a local federation: a SuperLink and N SuperNodes on 127.0.0.1 (free ports, "
                    "no TLS), node i with partition-id=i. The run's log is streamed; every process started is "
                    "stopped when the run ends, fails, times out or is interrupted.")
    parser.add_argument("--app", required=True, help="the App folder (hf-fedflat flower-app --output)")
    parser.add_argument("--supernodes", type=int, required=True, help="SuperNodes to start (usually num_clients)")
    parser.add_argument("--run-config", default=None,
                        help="overrides of the App's settings, as flwr run takes them: \"num_rounds=5 "
                             "resume_from_checkpoint='latest'\"")
    parser.add_argument("--state-dir", default=None,
                        help="a folder for the nodes' client states (node-<i>/): they survive a SuperNode restart")
    parser.add_argument("--node-config", default=None,
                        help="further node settings for every node, e.g. \"data-path=/data/site\"")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is stopped")
    known = parser.parse_args(argv)
    if known.supernodes < 1:
        print("hf-fedflat flower-local: error: --supernodes: give at least 1.", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(known.app, "pyproject.toml")):
        print(f"hf-fedflat flower-local: error: --app: {known.app} holds no pyproject.toml (write one with "
              "hf-fedflat flower-app).", file=sys.stderr)
        return 2
    try:
        from ..flower import require_flower

        require_flower()
    except RuntimeError as error:
        print(f"hf-fedflat flower-local: error: {error}", file=sys.stderr)
        return 2
    from ..flower.local import LocalFederation

    node_config = dict(item.split("=", 1) for item in (known.node_config or "").split() if "=" in item)
    run_config = dict(item.split("=", 1) for item in (known.run_config or "").split() if "=" in item)
    run_config = {k: v.strip("'\"") for k, v in run_config.items()}
    federation = LocalFederation(known.supernodes, folder=known.state_dir, state_dirs=known.state_dir is not None,
                                 node_config=node_config)
    try:
        federation.start()
        return federation.run(known.app, run_config, timeout=known.timeout)
    except KeyboardInterrupt:
        print("\nflower-local: interrupted; stopping the federation", file=sys.stderr)
        return 130
    finally:
        federation.stop()


COMMANDS = {
    "train": (train_main, "run one federated experiment (flags or --config run.yaml)"),
    "compare": (compare_main, "compare runs' history.json: Markdown table, PNG, CSV"),
    "sweep": (sweep_main, "a grid of runs (algorithms x hyperparameters x seeds x partitions) and its paper table: "
                          "--config sweep.yaml"),
    "partition": (partition_main, "split a dataset into clients: summary and heatmap"),
    "list": (list_main, "list algorithms, datasets and models"),
    "flower-app": (flower_app_main, "write a Flower App (hf_fedflat's ServerApp and ClientApp) from a run's config"),
    "flower-local": (flower_local_main, "run a Flower App on a SuperLink and N SuperNodes on 127.0.0.1"),
}


def _usage() -> str:
    lines = ["usage: hf-fedflat <command> [options]   (hf-fedflat <command> --help for its options)", "", "commands:"]
    lines += [f"  {name:<12} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hf-fedflat`` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"hf-fedflat: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return COMMANDS[command][0](rest)

