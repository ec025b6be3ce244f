"""The wire format of a round: tensors packed into one byte buffer, and what the round's messages hold.

Every exchange of the loop (see :mod:`hf_fedflat.federation.comm`) carries one ``{name: tensor}`` dict,
packed into a single ``uint8`` buffer (:func:`plan_tensors`, :func:`write_tensors`,
:func:`unpack_tensors`: exact for every dtype, no pickle). The names say what a tensor is:

- round inputs: ``params``, ``buffers``, ``broadcast/<piece>/<key>`` (one broadcast to every process) and
  ``client/<id>/<piece>/<key>`` (each process receives the states of the clients it trains);
- client results: ``<i>/meta`` (client id, samples, steps), ``<i>/scalars`` (loss, seconds), ``<i>/delta``,
  ``<i>/buffers``, ``<i>/msg/<piece>/<key>``, ``<i>/state/<piece>/<key>``, and ``failed/<id>`` (the
  reason a client was excluded, UTF-8 bytes).
"""

from __future__ import annotations

import torch

from ..algorithms.base import ClientUpdate
from ..state.store import flatten_state, unflatten_state

_ALIGN = 8  # every entry starts at a multiple of 8 bytes, so it unpacks as a view (no copy)


# --- packing ---------------------------------------------------------------------------------------------
def plan_tensors(tensors: dict[str, torch.Tensor]) -> tuple[dict, list[torch.Tensor]]:
    """The layout of ``tensors`` in one byte buffer, ``(meta, flat byte views)``, without copying anything.

    ``meta``: ``{"entries": [(name, dtype, shape, offset, size)], "nbytes": total}``.
    """
    entries, raws, nbytes = [], [], 0
    for name, tensor in tensors.items():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        entries.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), nbytes, raw.numel()))
        raws.append(raw)
        nbytes += raw.numel() + (-raw.numel() % _ALIGN)
    return {"entries": entries, "nbytes": nbytes}, raws


def write_tensors(plan: tuple[dict, list[torch.Tensor]], buffer: torch.Tensor) -> torch.Tensor:
    """Copy the planned tensors into ``buffer`` (``uint8``, at least ``meta["nbytes"]`` long); returns it.

    The alignment gaps are zeroed, so the bytes of a packed message depend only on its tensors."""
    meta, raws = plan
    for (_, _, _, offset, size), raw in zip(meta["entries"], raws):
        buffer[offset: offset + size].copy_(raw)
        end = offset + size
        buffer[end: end + (-size % _ALIGN)].zero_()
    return buffer


def unpack_tensors(meta: dict, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views into ``buffer`` (which must not be reused by the caller)."""
    return {
        name: buffer[offset: offset + size].view(getattr(torch, dtype)).reshape(shape)
        for name, dtype, shape, offset, size in meta["entries"]
    }


# --- round inputs ----------------------------------------------------------------------------------------
def round_payload(weights: dict[str, torch.Tensor], broadcast: dict) -> dict[str, torch.Tensor]:
    """What every process receives: ``params`` (and ``buffers``), and what the pieces broadcast."""
    payload = dict(weights)
    payload.update({f"broadcast/{k}": v for k, v in flatten_state(broadcast).items()})
    return payload


def client_states_payload(states: dict[int, dict]) -> dict[str, torch.Tensor]:
    """``{client id: state}`` as ``client/<id>/<piece>/<key>`` tensors."""
    return {f"client/{client_id}/{k}": v for client_id, state in states.items()
            for k, v in flatten_state(state).items()}


def split_payload(payload: dict[str, torch.Tensor]):
    """``(params or None, buffers or None, broadcast per piece, {client id: state})``."""
    broadcast, states = {}, {}
    for key, tensor in payload.items():
        if key.startswith("broadcast/"):
            broadcast[key.removeprefix("broadcast/")] = tensor
        elif key.startswith("client/"):
            _, client_id, rest = key.split("/", 2)
            states.setdefault(int(client_id), {})[rest] = tensor
    states = {cid: unflatten_state(state) for cid, state in states.items()}
    return payload.get("params"), payload.get("buffers"), unflatten_state(broadcast), states


# --- client results --------------------------------------------------------------------------------------
def encode_updates(updates: list[ClientUpdate], failures: dict[int, str]) -> dict[str, torch.Tensor]:
    out = {f"failed/{client_id}": torch.tensor(list(reason.encode()), dtype=torch.uint8)
           for client_id, reason in failures.items()}
    for i, u in enumerate(updates):
        out[f"{i}/meta"] = torch.tensor([u.client_id, u.num_samples, u.num_steps], dtype=torch.int64)
        out[f"{i}/scalars"] = torch.tensor([u.train_loss, u.train_seconds], dtype=torch.float64)
        out[f"{i}/delta"] = u.delta
        if u.buffers is not None:
            out[f"{i}/buffers"] = u.buffers
        out.update({f"{i}/msg/{k}": v for k, v in flatten_state(u.messages).items()})
        out.update({f"{i}/state/{k}": v for k, v in flatten_state(u.state).items()})
    return out


def decode_gathered(gathered: list[dict[str, torch.Tensor]]) -> tuple[list[ClientUpdate], dict[int, str]]:
    """All processes' updates in client order, and the failures ``{client id: reason}``."""
    updates, failures = [], {}
    for part in gathered:
        for key in [k for k in part if k.startswith("failed/")]:
            failures[int(key.removeprefix("failed/"))] = bytes(part.pop(key).tolist()).decode()
        updates.extend(decode_updates(part))
    return sorted(updates, key=lambda u: u.client_id), failures


def decode_updates(tensors: dict[str, torch.Tensor]) -> list[ClientUpdate]:
    grouped: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        index, rest = key.split("/", 1)
        grouped.setdefault(int(index), {})[rest] = tensor
    updates = []
    for index in sorted(grouped):
        part = grouped[index]
        client_id, num_samples, num_steps = (int(x) for x in part["meta"].tolist())
        train_loss, train_seconds = part["scalars"].tolist()  # (one read, not a select and a read per number)
        messages = {k.removeprefix("msg/"): v for k, v in part.items() if k.startswith("msg/")}
        state = {k.removeprefix("state/"): v for k, v in part.items() if k.startswith("state/")}
        updates.append(ClientUpdate(
            client_id=client_id, num_samples=num_samples, num_steps=num_steps, train_loss=train_loss,
            train_seconds=train_seconds,
            delta=part["delta"], messages=unflatten_state(messages), state=unflatten_state(state),
            buffers=part.get("buffers"),
        ))
    return updates
