"""The ServerApp's side of the round loop's seam: the round's clients trained on the SuperNodes of a Flower
federation (``FederatedTrainer.round_clients``, see :class:`hf_fedflat.federation.loop.LaunchProcesses`).

Each node says which client it is (its ``partition-id``) when it first connects (one ``query`` message); then, every
round, each sampled client's node receives one ``train`` message: what the algorithm sends every client
(:meth:`~hf_fedflat.federation.strategy.ServerStrategy.round_inputs`), the round, the learning rate and which of the
node's stored states the client starts from (:mod:`.node_state`). A client is left out of the round, with the
reason in the history's ``failed_clients``, when its node is not connected, does not reply within the wait, replies
with an error or a failure of its own, or sends a reply that is not a well-formed update: the wrong client,
keys, shapes or dtypes, non-finite values, no steps. The round then aggregates the replies that came, as a round
with failed clients does in simulation (``max_consecutive_failed_rounds`` stops a run that aggregates nothing).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from ..diagnostics.run import tensor_bytes
from ..federation.wire import decode_updates
from ..state.store import flatten_state
from ..training.parameters import all_finite
from .packing import pack, unpack

logger = logging.getLogger(__name__)

__all__ = ["FlowerClients"]


class FlowerClients:
    """Trains each round's clients on their SuperNodes through ``grid`` (a Flower ``Grid``).

    Args:
        grid: the ServerApp's ``Grid``.
        reply_timeout: seconds to wait for a round's replies (a node killed mid-round is then left out).
        connect_timeout: seconds to wait, before the first round, for a node of every client to connect.
    """

    def __init__(self, grid, *, reply_timeout: float = 600.0, connect_timeout: float = 300.0):
        self.grid, self.reply_timeout, self.connect_timeout = grid, reply_timeout, connect_timeout
        self.node_of: dict[int, int] = {}  # client id -> node id
        self.client_of: dict[int, int | None] = {}  # node id -> client id (None: the node did not say)
        self.message_layout: dict[str, tuple] | None = None  # the pieces' messages: names -> (dtype, shape)
        self._connected = False

    # -- which node is which client ---------------------------------------------------------------
    def refresh(self, num_clients: int) -> None:
        """Ask every newly connected node its client id; forget nodes that left."""
        from flwr.app import ConfigRecord, Message, MessageType, RecordDict

        online = set(self.grid.get_node_ids())
        for node_id in [n for n in self.client_of if n not in online]:
            client = self.client_of.pop(node_id)
            if client is not None and self.node_of.get(client) == node_id:
                del self.node_of[client]
        new = [n for n in online if n not in self.client_of]
        if not new:
            return
        queries = [Message(RecordDict({"config": ConfigRecord({"ask": "partition-id"})}), dst_node_id=n,
                           message_type=MessageType.QUERY) for n in new]
        for reply in self.grid.send_and_receive(queries, timeout=self.reply_timeout):
            node_id = reply.metadata.src_node_id
            if reply.has_error() or "config" not in reply.content:
                logger.warning("SuperNode %s did not say its partition-id: %s", node_id,
                               reply.error.reason if reply.has_error() else "no config in its reply")
                self.client_of[node_id] = None
                continue
            config = reply.content["config"]
            if config.get("failure"):
                logger.error("%s", config["failure"])
                self.client_of[node_id] = None
                continue
            client = int(config["partition-id"])
            if not 0 <= client < num_clients:
                logger.error("SuperNode %s has partition-id %d, not a client of this run (num_clients %d): ignored",
                             node_id, client, num_clients)
                client = None
            elif client in self.node_of and self.node_of[client] in online:
                logger.error("SuperNode %s also says partition-id %d (node %s has it): ignored", node_id, client,
                             self.node_of[client])
                client = None
            else:
                if client in self.node_of:
                    logger.info("client %d is back, on SuperNode %s", client, node_id)
                self.node_of[client] = node_id
            self.client_of[node_id] = client

    def connect(self, num_clients: int) -> None:
        """Before the first round: wait until every client's node is connected (or the connect timeout passes)."""
        deadline = time.monotonic() + self.connect_timeout
        while True:
            self.refresh(num_clients)
            if len(self.node_of) >= num_clients or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        missing = sorted(set(range(num_clients)) - set(self.node_of))
        if missing:
            logger.warning("after %ss, no SuperNode for client(s) %s: they are left out of every round they are "
                           "sampled in until one connects", self.connect_timeout, missing)
        else:
            logger.info("%d SuperNodes connected, one per client", num_clients)
        self._connected = True

    # -- one round -------------------------------------------------------------------------------
    def train_round(self, trainer, round_index: int, learning_rate: float, clients: list[int], round_start: float,
                    watch) -> tuple[list, dict[int, str], dict[str, Any]]:
        from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

        num_clients = trainer.args.num_clients
        if self._connected:
            self.refresh(num_clients)
        else:
            self.connect(num_clients)
        strategy = trainer.strategy
        payload = strategy.round_inputs(round_index)
        strategy.payload_bytes = tensor_bytes(payload)
        array, layout = pack(payload)
        failures: dict[int, str] = {}
        messages = []
        for client in clients:
            node_id = self.node_of.get(client)
            if node_id is None:
                failures[client] = f"no SuperNode with partition-id={client} is connected"
                continue
            state_round, keep_round = self._state_rounds(trainer, client)
            messages.append(Message(RecordDict({
                "arrays": ArrayRecord({"payload": Array(array)}),
                "config": ConfigRecord({"layout": layout, "round": round_index, "client_id": client,
                                        "learning_rate": float(learning_rate), "state_round": state_round,
                                        "keep_round": keep_round}),
            }), dst_node_id=node_id, message_type=MessageType.TRAIN))
        waiting = {m.metadata.dst_node_id: self.client_of[m.metadata.dst_node_id] for m in messages}
        node_bytes = {str(client): [int(array.nbytes), 0] for client in waiting.values()}
        sent_at = time.monotonic()
        replies = list(self.grid.send_and_receive(messages, timeout=self.reply_timeout)) if messages else []
        waited = time.monotonic() - sent_at
        updates = []
        for reply in replies:  # one message per node: its reply is its client's
            client = waiting.pop(reply.metadata.src_node_id, None)
            if client is None:
                continue
            update, reason, nbytes = self._read_reply(reply, client, payload)
            node_bytes[str(client)][1] = nbytes
            if reason is not None:
                failures[client] = reason
            else:
                updates.append(update)
        for node_id, client in waiting.items():
            failures[client] = (f"no reply from its SuperNode (node {node_id}) within {self.reply_timeout:g}s: the "
                                "node left or is too slow" if waited >= self.reply_timeout else
                                f"no reply from its SuperNode (node {node_id}): the SuperLink dropped the message "
                                f"after {waited:.0f}s (the node left the federation)")
        updates.sort(key=lambda u: u.client_id)  # the order of the built-in loop's gather
        transport = {"node_bytes": node_bytes,
                     "bytes_sent": sum(b[0] for b in node_bytes.values()),
                     "bytes_received": sum(b[1] for b in node_bytes.values())}
        return updates, failures, transport

    def _state_rounds(self, trainer, client: int) -> tuple[int, int]:
        """``(the round whose state the client starts from, the oldest round a resume may still ask for)``: its last
        aggregated round, overall and up to the latest checkpoint (0: none, the empty state)."""
        every = trainer.args.save_every_n_rounds or 0
        history = trainer.history
        last_round = history[-1]["round"] if history else 0
        checkpoint = (last_round // every) * every if every else 0
        state_round = keep_round = 0
        for record in history:
            if client in record.get("clients", ()) and record.get("num_clients", 0) > 0:
                state_round = record["round"]
                if record["round"] <= checkpoint:
                    keep_round = record["round"]
        return state_round, keep_round

    def _read_reply(self, reply, client: int, payload: dict[str, torch.Tensor]):
        """``(update, None, bytes received)`` or ``(None, why it is left out, bytes received)``."""
        if reply.has_error():
            return None, f"its SuperNode failed: {reply.error.reason or 'error code ' + str(reply.error.code)}", 0
        content = reply.content
        config = content.get("config")
        if config is None:
            return None, "malformed reply: no config record", 0
        if config.get("failure"):
            return None, str(config["failure"]), 0
        try:
            packed = content["arrays"]["update"].numpy()
            tensors = unpack(packed, config["layout"])
            found = decode_updates(tensors)
        except Exception as error:  # whatever a broken or hostile node sent: left out, with the reason
            return None, f"malformed reply: {type(error).__name__}: {error}", 0
        nbytes = int(packed.nbytes)
        reason = self._check_update(found, client, payload)
        return (None if reason else found[0]), reason, nbytes

    def _check_update(self, found: list, client: int, payload: dict[str, torch.Tensor]) -> str | None:
        if len(found) != 1:
            return f"malformed reply: {len(found)} updates, expected 1"
        update = found[0]
        if update.client_id != client:
            return f"malformed reply: the update of client {update.client_id}, expected {client}"
        params = payload["params"]
        if update.delta.shape != params.shape or update.delta.dtype != params.dtype:
            return (f"malformed reply: delta is {update.delta.dtype} {tuple(update.delta.shape)}, the model's "
                    f"parameters are {params.dtype} {tuple(params.shape)}")
        buffers = payload.get("buffers")
        if (buffers is None) != (update.buffers is None) or (
                buffers is not None and (update.buffers.shape != buffers.shape or update.buffers.dtype != buffers.dtype)):
            return "malformed reply: its averaged buffers do not match the model's"
        if update.state:
            return "malformed reply: it carries the client's state, which stays on the node"
        if update.num_steps <= 0 or update.num_samples <= 0:
            return f"trained {update.num_steps} steps on {update.num_samples} samples: nothing to aggregate"
        if not math.isfinite(update.train_loss):
            return f"training loss is {update.train_loss}"
        tensors = [update.delta, *flatten_state(update.messages).values()]
        if update.buffers is not None:
            tensors.append(update.buffers)
        if not all_finite(tensors):
            return "update contains NaN or Inf"
        layout = {k: (v.dtype, tuple(v.shape)) for k, v in flatten_state(update.messages).items()}
        if self.message_layout is None:
            self.message_layout = layout  # the pieces' uploads: the same names, dtypes and shapes every time
        elif layout != self.message_layout:
            return (f"malformed reply: its messages {sorted(layout)} differ from the algorithm's "
                    f"{sorted(self.message_layout)} (names, dtypes or shapes)")
        return None
