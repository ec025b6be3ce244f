"""What the Flower tests share: a small run's settings, the built-in run of them, and a Grid that delivers messages
to real ClientApps in this process (the server's and the nodes' code without Flower's processes)."""

from __future__ import annotations

import glob
import os
from typing import Any, Callable

import torch
import yaml

#: digits at 8x8, the small CNN, 3 clients with Dir(0.3) label skew, 2 rounds of 1 local epoch
RUN_CONFIG: dict[str, Any] = {
    "dataset_name": "digits", "model_name": "small_cnn", "image_size": 8, "num_clients": 3, "clients_per_round": 3,
    "num_rounds": 2, "local_epochs": 1, "optim": "sgd", "learning_rate": 0.05, "per_device_train_batch_size": 64,
    "partition_scheme": "dirichlet", "dirichlet_alpha": 0.3, "seed": 42, "eval_every_n_rounds": 1,
    "save_every_n_rounds": 1, "report_to": "none", "disable_tqdm": True,
}


def write_config(folder, **changes) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "run.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({**RUN_CONFIG, **changes}, f)
    return path


def train_builtin(folder, **changes) -> str:
    """``hf-fedflat train`` of the settings (in this process); its output folder."""
    from hf_fedflat.cli.commands import train_main

    output = os.path.join(folder, "builtin")
    os.makedirs(folder, exist_ok=True)
    assert train_main(["--config", write_config(folder, output_dir=output, **changes)]) == 0
    return output


def final_weights(output_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (path,) = glob.glob(os.path.join(output_dir, "final_model", "*.safetensors"))
    return load_file(path)


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


class InProcessGrid:
    """A Flower ``Grid`` whose nodes are hf_fedflat ClientApps called in this process, each with its own
    ``Context`` (``node_config``, ``state``), as a SuperNode calls them.

    ``absent(round_index, client) -> bool`` drops a node's train message (no reply, as a killed node);
    ``tamper(reply, client, round_index) -> reply`` replaces a reply (a broken or hostile node);
    ``app_has_settings=False``: the nodes' App declares no settings (``run_config`` is empty) and the ClientApp is
    given ``run_config`` in Python (``client_app(settings=...)``)."""

    def __init__(self, run_config: dict[str, Any], num_nodes: int, node_config: Callable[[int], dict] | None = None,
                 absent: Callable[[int, int], bool] | None = None, tamper=None, app_has_settings: bool = True):
        from flwr.app import Context, RecordDict
        from flwr.supercore.task_identity import TaskIdentity

        from hf_fedflat.flower import client_app
        from hf_fedflat.flower import node

        # The nodes' experiments are built first, then the server's: accelerate keeps one state per process, which a
        # new TrainingArguments resets and the last Trainer built sets up again (in a deployment each is a process).
        node._EXPERIMENTS.clear()
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # (Message needs a task identity)
        # (a deployment's ClientApp hands them to the node's worker)
        self.app = client_app(settings=None if app_has_settings else dict(run_config), train_here=node.train_message)
        self.contexts = {}
        for i in range(num_nodes):
            settings = {"partition-id": i, "num-partitions": num_nodes,
                        **(node_config(i) if node_config else {})}
            self.contexts[1000 + i] = Context(run_id=1, node_id=1000 + i, node_config=settings, state=RecordDict(),
                                              run_config=dict(run_config) if app_has_settings else {})
            try:
                node._node_experiment(dict(run_config), node.node_settings(settings))
            except Exception:  # (a node whose settings are wrong answers its messages with the reason)
                pass
        self.absent, self.tamper = absent, tamper
        self.sent: list[tuple[int, str]] = []  # (node id, message type)

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            node_id = message.metadata.dst_node_id
            self.sent.append((node_id, message.metadata.message_type))
            context = self.contexts[node_id]
            config = message.content["config"]
            client = int(context.node_config["partition-id"])
            if "round" in config and self.absent and self.absent(int(config["round"]), client):
                continue
            reply = self.app(message, context)
            reply.metadata.__dict__["_src_node_id"] = node_id  # (a SuperNode stamps its id on what it sends)
            if "round" in config and self.tamper is not None:
                reply = self.tamper(reply, client, int(config["round"]))
            replies.append(reply)
        return replies


def run_in_process(folder, grid_options: dict | None = None, **changes):
    """The ServerApp's rounds (:func:`hf_fedflat.flower.run_server`) on an :class:`InProcessGrid`; its output folder
    and the grid."""
    from hf_fedflat.flower import run_server
    from hf_fedflat.flower.settings import app_settings

    output = os.path.join(folder, "flower")
    num_nodes = changes.pop("_nodes", changes.get("num_clients", RUN_CONFIG["num_clients"]))
    config = app_settings({**RUN_CONFIG, "output_dir": output, **changes})
    grid = InProcessGrid(config, num_nodes, **(grid_options or {}))
    run_server(grid, {**config, "flower_reply_timeout": 5.0, "flower_connect_timeout": 0.0})
    return output, grid
