"""The ClientApp: one SuperNode trains its client with hf_fedflat's client trainer, keeping its data and state.

Each ``train`` message names the round, the client, the round's learning rate and the round whose state the client
starts from, and carries what the algorithm sends every client (the weights to start from and what the pieces
broadcast: SCAFFOLD's ``c``, FedDyn's nothing, ...). The node builds the run's experiment from the App's settings
(the same data, partition, initial model and local ``Trainer`` as ``hf-fedflat train``), trains its client as a
process of ``accelerate launch`` does (:meth:`~hf_fedflat.federation.client.LocalTraining.train_safely`: the same
seed per (seed, round, client), the same failure checks), keeps the client's new state here
(:mod:`.node_state`) and replies with what the algorithm uploads: the update, the pieces' messages, the averaged
buffers, the sample and step counts; never the state.

The node's settings (``flower-supernode --node-config``):

- ``partition-id`` (required): the client this node is, ``0 <= id < num_clients``; the server samples client ids;
- ``num-partitions``: if given, must equal the run's ``num_clients``;
- ``data-path``: the node's own data (a folder or file the CLI reads, or a registered dataset's local copy): every
  training row of it is this client's. Without it the node takes its client's share of the run's dataset, split
  as in simulation;
- ``state-dir``: a folder for the client's state (it then survives a restart of the SuperNode) and the node's
  working files; without it the state lives in the SuperNode's memory for the run.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from .settings import parse_run_config

logger = logging.getLogger(__name__)

__all__ = ["NodeError", "node_settings", "train_message"]

_EXPERIMENTS: dict[Any, Any] = {}  # this process's experiments per (settings, node settings): built once
_KEEP_EXPERIMENTS = 4  # (a warm worker serves the runs of one federation; a few of them at a time)
_SERVER_ONLY = {"output_dir", "resume_from_checkpoint", "logging_dir", "report_to", "push_to_hub", "hub_model_id",
                "hub_strategy", "hub_private_repo", "hub_token", "overwrite_output_dir", "do_eval", "do_predict"}


class NodeError(ValueError):
    """A node's setting or data is wrong: one line naming the node and the field."""


def node_settings(node_config: dict[str, Any], check_data: bool = True) -> dict[str, Any]:
    """The node's settings, checked: ``partition_id``, ``num_partitions``, ``data_path``, ``state_dir``
    (``check_data=False``: the data path is not looked at)."""
    def number(key):
        value = node_config.get(key)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise NodeError(f"node-config {key}: {value!r} is not an integer.") from None

    from .relay import partition_id_of

    try:
        partition_id = partition_id_of(node_config)
    except ValueError as error:
        raise NodeError(str(error)) from None
    data_path = node_config.get("data-path") or None
    if check_data and data_path is not None and not os.path.exists(str(data_path)):
        raise NodeError(f"node {partition_id}: node-config data-path: {data_path} does not exist.")
    return {"partition_id": partition_id, "num_partitions": number("num-partitions"),
            "data_path": None if data_path is None else str(data_path),
            "state_dir": str(node_config["state-dir"]) if node_config.get("state-dir") else None}


def _node_experiment(run_config: dict[str, Any], node: dict[str, Any]):
    """The run's experiment as this node builds it (cached for the process)."""
    # (the settings a node's training reads: not where the server writes, nor the deployment's own settings)
    kept = {k: str(v) for k, v in run_config.items() if k not in _SERVER_ONLY and not k.startswith("flower_")}
    key = (tuple(sorted(kept.items())), tuple(sorted(node.items())))
    if key in _EXPERIMENTS:
        _EXPERIMENTS[key] = _EXPERIMENTS.pop(key)  # most recently used last
        return _EXPERIMENTS[key]
    from ..cli.experiment import build_node_experiment
    from ..data.catalog import DATASETS

    work = node["state_dir"] or os.path.join(tempfile.gettempdir(), f"hf_fedflat_node_{node['partition_id']}")
    changes: dict[str, Any] = {"output_dir": os.path.join(work, "work"), "resume_from_checkpoint": "",
                               "push_to_hub": False, "report_to": "none"}
    data_path = node["data_path"]
    if data_path is not None:  # a registered dataset's local copy, or files/folders the CLI reads
        dataset = run_config.get("dataset_name", "digits")
        changes["data_dir" if dataset in DATASETS and dataset != "digits" else "dataset_name"] = data_path
    data_args, model_args, lora_args, args = parse_run_config(run_config, **changes)
    if node["num_partitions"] is not None and node["num_partitions"] != args.num_clients:
        raise NodeError(f"node {node['partition_id']}: node-config num-partitions: {node['num_partitions']}, but the "
                        f"run has num_clients={args.num_clients}.")
    if not 0 <= node["partition_id"] < args.num_clients:
        raise NodeError(f"node-config partition-id: {node['partition_id']} is not a client of this run "
                        f"(0 <= partition-id < num_clients={args.num_clients}).")
    experiment = build_node_experiment(data_args, model_args, args, lora_args=lora_args,
                                       own_client=node["partition_id"] if data_path is not None else None)
    _EXPERIMENTS[key] = experiment
    while len(_EXPERIMENTS) > _KEEP_EXPERIMENTS:
        del _EXPERIMENTS[next(iter(_EXPERIMENTS))]
    return experiment


def train_message(config: dict[str, Any], payload, run_config: dict[str, Any], node_config: dict[str, Any],
                  records: dict) -> dict[str, Any]:
    """Train the client a ``train`` message names (its ``config`` and ``payload`` bytes as a uint8 array); returns the
    reply's parts: ``{"update": (array, layout), "num_examples": n}``, or ``{"failure": reason}``. ``records``: the
    client states kept in ``Context.state`` (read and updated in place; unused with a ``state-dir``)."""
    from ..cli.exit_codes import input_error_types

    try:
        node = node_settings(node_config)
        experiment = _node_experiment(run_config, node)
    except (NodeError, *input_error_types()) as error:
        where = f"node {node_config.get('partition-id', '?')}"
        reason = str(error) if str(error).startswith(("node ", "node-config")) else f"{where}: {error}"
        logger.error("%s", reason)
        return {"failure": reason}
    from ..federation.client import ClientStart
    from ..federation.wire import encode_updates, split_payload
    from .node_state import NodeStates
    from .packing import pack, unpack

    client_id, round_index = int(config["client_id"]), int(config["round"])
    if client_id != node["partition_id"]:
        return {"failure": f"node {node['partition_id']}: received the message of client {client_id}"}
    trainer = experiment.trainer
    states = NodeStates(node["state_dir"] and os.path.join(node["state_dir"], "client_states"), records)
    state_round, keep_round = int(config["state_round"]), int(config["keep_round"])
    state = states.get(client_id, state_round)
    if state is None:
        return {"failure": f"node {client_id}: holds no client state of round {state_round} (restarted without "
                           "its state-dir?); restart it with --node-config \"... state-dir=<its folder>\"."}
    params, buffers, broadcast, _ = split_payload(unpack(payload, config["layout"]))
    start = ClientStart(params, broadcast, state, buffers)
    update, failure = trainer.local_training.train_safely(trainer.train_client, client_id, round_index,
                                                          float(config["learning_rate"]), start)
    if failure is not None:
        return {"failure": failure}
    states.put(client_id, round_index + 1, update.state)
    states.keep(client_id, {state_round, keep_round, round_index + 1})
    update.state = {}  # stays here
    return {"update": pack(encode_updates([update], {})), "num_examples": update.num_samples}
