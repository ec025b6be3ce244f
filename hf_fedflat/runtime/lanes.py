"""Several clients of a round at once in one process (``concurrent_clients > 1``, :mod:`.arguments`).

A :class:`Lane` is one thread with its own model replica and local Trainer (built by
:mod:`hf_fedflat.federation.concurrent`) and, on CUDA, its own stream: its kernels queue beside the other
lanes' and the GPU runs them side by side while the host prepares the next step. :func:`run_lanes` hands the
clients of the process's share, in order, to whichever lane is free and returns the results in the share's
order, so the round aggregates exactly what training one client at a time gives.

The clients of a round are independent given their seeds: each client's training reseeds the generators from
``(seed, round, client)``. Two things are process-wide and shared by the threads, and are made per lane:

* **The global random generators** (Python, NumPy, torch's CPU generator and the lane's CUDA device's). A
  client draws from them after its reseeding: the sampler reads torch's seed when the dataloader is built, the
  DataLoader draws its base seed when iterated, dropout draws in the step and random transforms in the batch
  fetch. :class:`RngGuard` is one lock under which a lane runs all of a client's work except the Trainer's loop
  between those points (optimizer step, clipping, scheduler, callbacks, loss bookkeeping); whoever takes it
  gets its own generator states swapped in (:func:`instrument` puts the points under it). So every client
  draws the numbers it would draw alone, and the weights are bit-identical to ``concurrent_clients=1``.
* **accelerate's** ``GradientState`` (a process-wide "borg": whether a micro-batch syncs and steps the
  optimizer under gradient accumulation, which dataloaders are being iterated): each lane's accelerator,
  optimizer and training dataloaders get a state of their own (:func:`own_gradient_state`).

What overlaps, then: one lane's Trainer loop outside its step and batch fetch with another lane's step, and on
CUDA every lane's kernels with the host work of the others (the launches are asynchronous, the lock is held only
while they are queued). On a CPU the forward and backward passes take turns, so no speed-up is expected there
(``benchmarks/concurrent_clients.py``); the mechanism is for small models on a GPU, where one client's kernels
leave the device mostly idle.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import switch, vectors

__all__ = ["Lane", "RngGuard", "current_lane", "instrument", "own_gradient_state", "run_lanes"]

_local = threading.local()


def current_lane() -> "Lane | None":
    """The lane this thread runs (None outside :func:`run_lanes`: the process's own thread)."""
    return getattr(_local, "lane", None)


@dataclass(eq=False)
class Lane:
    """One of the clients trained at once: its local Trainer (with its own model), what the caller keeps beside
    it (``buffer_space``: the model's averaged buffers, or None), its CUDA stream (None on a CPU)."""

    index: int
    trainer: Any
    buffer_space: Any = None
    stream: "torch.cuda.Stream | None" = None
    #: the generator states of this lane's client while another lane holds the guard (see RngGuard)
    rng_states: tuple | None = field(default=None, repr=False)
    holding: bool = field(default=False, repr=False)
    #: clients this lane trained (tests, benchmarks)
    clients: list[int] = field(default_factory=list, repr=False)


class RngGuard:
    """One lock over the process's global random generators, each lane drawing from its own states.

    Taking the guard swaps the taker's saved states in (and saves the previous holder's) when another lane
    held it last; a lane that takes it again after itself pays nothing. Nothing may draw from the global
    generators in a lane thread outside the guard: :func:`instrument` leaves only the Trainer's loop outside it,
    and within the loop puts the dataloader's creation, the batch fetch and the step back under it.
    """

    def __init__(self, device: torch.device | str):
        device = torch.device(device)
        self.cuda_device = device if device.type == "cuda" else None
        self._lock = threading.Lock()
        self._owner: Lane | None = None
        #: how often the states were swapped (tests, benchmarks)
        self.swaps = 0

    def _capture(self) -> tuple:
        cuda = torch.cuda.get_rng_state(self.cuda_device) if self.cuda_device is not None else None
        return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda

    def _restore(self, states: tuple) -> None:
        python, numpy, cpu, cuda = states
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, self.cuda_device)

    def _acquire(self, lane: Lane) -> None:
        self._lock.acquire()
        lane.holding = True
        if self._owner is not lane:
            if self._owner is not None:
                self._owner.rng_states = self._capture()
            if lane.rng_states is not None:
                self._restore(lane.rng_states)
            self._owner = lane
            self.swaps += 1

    def _release(self, lane: Lane) -> None:
        lane.holding = False
        self._lock.release()

    @contextlib.contextmanager
    def hold(self, lane: Lane | None = None) -> Iterator[None]:
        """The block runs under the guard with ``lane``'s states (default: this thread's lane; a thread without
        a lane, or a lane already holding it, just runs the block)."""
        lane = lane if lane is not None else current_lane()
        if lane is None or lane.holding:
            yield
            return
        self._acquire(lane)
        try:
            yield
        finally:
            self._release(lane)

    @contextlib.contextmanager
    def released(self, lane: Lane | None = None) -> Iterator[None]:
        """The block runs with the guard let go (taken again after it), if this thread's lane holds it."""
        lane = lane if lane is not None else current_lane()
        if lane is None or not lane.holding:
            yield
            return
        self._release(lane)
        try:
            yield
        finally:
            self._acquire(lane)

    def forget(self) -> None:
        """After a share: no lane's states are in the generators any more (each client reseeds anyway)."""
        with self._lock:
            self._owner = None


def own_gradient_state():
    """A copy of accelerate's process-wide ``GradientState`` that only its holders share (syncing on, no
    dataloader being iterated)."""
    from accelerate.state import GradientState

    shared = GradientState()
    state = GradientState.__new__(GradientState)  # without __init__, which binds the process-wide dict
    state.__dict__ = {**shared.__dict__, "sync_gradients": True, "_dataloader_references_ref": [None],
                      "plugin_kwargs": dict(shared.plugin_kwargs)}
    return state


def instrument(trainer, guard: RngGuard) -> None:
    """Make a local ``Trainer`` safe to run in a lane (its methods are wrapped on the instance; called from the
    process's own thread, they behave as before):

    * ``train`` lets the guard go for the Trainer's loop; ``get_train_dataloader`` (the sampler reads torch's
      seed), ``get_batch_samples`` (the DataLoader's base seed, random transforms) and ``training_step``
      (dropout) take it back;
    * the accelerator, the prepared optimizer and each training dataloader share a ``GradientState`` of this
      trainer's own.
    """
    if getattr(trainer, "_lane_guard", None) is guard:
        return
    trainer._lane_guard = guard
    state = own_gradient_state()
    trainer.accelerator.gradient_state = state

    def adopt(obj) -> None:
        if obj is not None and hasattr(obj, "gradient_state"):
            obj.gradient_state = state

    adopt(trainer.optimizer)
    train, get_train_dataloader = trainer.train, trainer.get_train_dataloader
    get_batch_samples, training_step = trainer.get_batch_samples, trainer.training_step
    prepare = trainer._prepare_for_training

    def lane_train(*args, **kwargs):
        with guard.released():
            return train(*args, **kwargs)

    def lane_get_train_dataloader(*args, **kwargs):
        with guard.hold():
            loader = get_train_dataloader(*args, **kwargs)
        adopt(loader)
        return loader

    def lane_get_batch_samples(*args, **kwargs):
        with guard.hold():
            return get_batch_samples(*args, **kwargs)

    def lane_training_step(*args, **kwargs):
        with guard.hold():
            return training_step(*args, **kwargs)

    def lane_prepare_for_training(*args, **kwargs):
        prepared = prepare(*args, **kwargs)
        adopt(trainer.optimizer)
        if isinstance(prepared, tuple) and len(prepared) == 2:
            adopt(prepared[1])
        return prepared

    trainer.train = lane_train
    trainer.get_train_dataloader = lane_get_train_dataloader
    trainer.get_batch_samples = lane_get_batch_samples
    trainer.training_step = lane_training_step
    trainer._prepare_for_training = lane_prepare_for_training


def run_lanes(lanes: Sequence[Lane], guard: RngGuard, items: Sequence[Any], work: Callable[[Lane, Any], Any],
              poll: Callable[[], None] | None = None, poll_seconds: float = 0.5) -> list[Any]:
    """``[work(lane, item) for item in items]``, each call in one of the lanes' threads, under the guard.

    Items are taken in order by whichever lane is free; the results come back in the items' order. The lanes'
    threads see the caller's fast-path setting (:mod:`.switch`) and, on a CPU, its vector recycler. On CUDA each
    lane runs on its stream, which first waits for the caller's stream; the caller's stream then waits for every
    lane's. ``poll()`` runs in the calling thread every ``poll_seconds`` while the lanes work (the parent-process
    watch); an exception it raises ends the wait (the lanes are daemon threads). The first exception a ``work``
    call raises stops the hand-out and is raised here once the lanes have stopped.
    """
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    position = [0]
    hand_out = threading.Lock()
    setting = switch.current()
    caller_stream = None
    if any(lane.stream is not None for lane in lanes):
        caller_stream = torch.cuda.current_stream(lanes[0].stream.device)
    recycler = vectors._active.recycler if caller_stream is None else None  # (CUDA: storages cross streams)

    def next_item() -> int | None:
        with hand_out:
            if errors or position[0] >= len(items):
                return None
            position[0] += 1
            return position[0] - 1

    def lane_thread(lane: Lane) -> None:
        _local.lane = lane
        switch._current.setting = setting
        vectors._active.recycler = recycler
        stream_context = contextlib.nullcontext()
        if lane.stream is not None:
            torch.cuda.set_device(lane.stream.device)
            lane.stream.wait_stream(caller_stream)
            stream_context = torch.cuda.stream(lane.stream)
        try:
            with stream_context:
                while (index := next_item()) is not None:
                    with guard.hold(lane):
                        results[index] = work(lane, items[index])
                    lane.clients.append(items[index])
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            with hand_out:
                errors.append(error)
        finally:
            _local.lane = None

    threads = [threading.Thread(target=lane_thread, args=(lane,), name=f"hf_fedflat-lane-{lane.index}", daemon=True)
               for lane in lanes[: max(1, min(len(lanes), len(items)))]]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(poll_seconds if poll is not None else None)
            if poll is not None and thread.is_alive():
                poll()
    guard.forget()
    if caller_stream is not None:
        for lane in lanes:
            caller_stream.wait_stream(lane.stream)
    if errors:
        raise errors[0]
    return results
