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

__all__ = ["client_app", "node_settings", "train_message"]

_EXPERIMENTS: dict[Any, Any] = {}  # this process's experiment per (run, node settings): built once


class NodeError(ValueError):
    """A node's setting or data is wrong: one line naming the node and the field."""


def node_settings(node_config: dict[str, Any]) -> dict[str, Any]:
    """The node's settings, checked: ``partition_id``, ``num_partitions``, ``data_path``, ``state_dir``."""
    def number(key):
        value = node_config.get(key)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise NodeError(f"node-config {key}: {value!r} is not an integer.") from None

    partition_id = number("partition-id")
    if partition_id is None:
        raise NodeError("node-config partition-id: missing; start the SuperNode with --node-config "
                        "\"partition-id=<this node's client id> ...\".")
    data_path = node_config.get("data-path") or None
    if data_path is not None and not os.path.exists(str(data_path)):
        raise NodeError(f"node {partition_id}: node-config data-path: {data_path} does not exist.")
    return {"partition_id": partition_id, "num_partitions": number("num-partitions"),
            "data_path": None if data_path is None else str(data_path),
            "state_dir": str(node_config["state-dir"]) if node_config.get("state-dir") else None}


def _node_experiment(run_config: dict[str, Any], node: dict[str, Any]):
    """The run's experiment as this node builds it (cached for the process)."""
    key = (tuple(sorted((k, str(v)) for k, v in run_config.items())), tuple(sorted(node.items())))
    if key in _EXPERIMENTS:
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


def _train_here_or_in_worker(msg, context) -> dict[str, Any]:
    """The reply's parts (:func:`train_message`), trained by the node's warm worker (:mod:`.worker`) unless the node
    says ``warm-worker=false``; the states kept in ``Context.state`` are passed both ways."""
    import numpy as np
    from flwr.app import ConfigRecord

    from .node_state import RECORD_PREFIX

    config = dict(msg.content["config"])
    payload = msg.content["arrays"]["payload"].numpy()
    run_config, node_config = dict(context.run_config), dict(context.node_config)
    records = {k: {"bytes": bytes(v["bytes"]), "layout": str(v["layout"])} for k, v in context.state.items()
               if k.startswith(RECORD_PREFIX)}
    before = set(records)
    if str(node_config.get("warm-worker", "true")).lower() in ("false", "0", "no"):
        result = train_message(config, payload, run_config, node_config, records)
    else:
        from .worker import call_worker, socket_path

        node_key = f"{node_config.get('state-dir') or ''}:{node_config.get('partition-id')}"
        anchor = os.getppid()  # the SuperNode's process that started this ClientApp: the worker ends with it
        header = {"config": config, "run_config": run_config, "node_config": node_config,
                  "record_layouts": {k: v["layout"] for k, v in records.items()}}
        reply, blobs = call_worker(socket_path(node_key, anchor), anchor, header,
                                   [payload.tobytes(), *(records[k]["bytes"] for k in header["record_layouts"])])
        if reply.get("log"):
            print(reply["log"], end="", flush=True)  # the worker's lines for this message, in the node's log
        if "error" in reply:
            raise RuntimeError(f"the node's worker failed: {reply['error']}")
        update, *states = blobs
        records = {k: {"bytes": b, "layout": layout} for (k, layout), b in zip(reply["record_layouts"].items(), states)}
        result = {k: v for k, v in reply.items() if k in ("failure", "num_examples")}
        if "layout" in reply:
            result["update"] = (np.frombuffer(update, dtype=np.uint8), reply["layout"])
    for key in before - set(records):
        del context.state[key]
    for key, value in records.items():
        context.state[key] = ConfigRecord(value)
    return result


def client_app():
    """hf_fedflat's Flower ``ClientApp`` (the App's ``clientapp`` component)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        result = _train_here_or_in_worker(msg, context)
        if "failure" in result:
            return Message(RecordDict({"config": ConfigRecord({"failure": result["failure"]})}), reply_to=msg)
        array, layout = result["update"]
        return Message(RecordDict({
            "arrays": ArrayRecord({"update": Array(array)}),
            "config": ConfigRecord({"layout": layout, "failure": ""}),
            "metrics": MetricRecord({"num-examples": result["num_examples"]}),
        }), reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Which client this node is (the server asks each node once, when it connects)."""
        try:
            settings = node_settings(dict(context.node_config))
        except NodeError as error:
            logger.error("%s", error)
            return Message(RecordDict({"config": ConfigRecord({"failure": str(error)})}), reply_to=msg)
        return Message(RecordDict({"config": ConfigRecord({"partition-id": settings["partition_id"]})}),
                       reply_to=msg)

    return app
