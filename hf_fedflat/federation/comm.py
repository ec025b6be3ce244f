"""Cross-process exchange for the round loop.

Why not the stock distributed Trainer: inside ``accelerate launch`` a ``Trainer`` wraps the model in
DDP (averaging the gradients of *different* clients), shards each client's data across processes and
hangs when processes take different numbers of steps. Federated processes must instead be independent
single-process trainers that meet only at round boundaries. So, before ``TrainingArguments`` sets up
devices, :func:`init_federated_process_group` opens a gloo group for the exchange itself and hides the
launcher's rank variables: accelerate and the Trainer then see one process each. The exchange (one
broadcast and one gather per round) packs tensors into one byte buffer (:mod:`.wire`), so any dtype travels exactly.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.vectors import BufferPool
from .wire import plan_tensors, unpack_tensors, write_tensors

# What launchers (accelerate, torchrun, MPI) set and accelerate/transformers read to go distributed.
_LAUNCHER_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
    "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "TORCHELASTIC_RUN_ID",
)
_GROUP: "FederatedProcessGroup | None" = None


@dataclass
class FederatedProcessGroup:
    """This process's place among the federated processes (world_size 1 without a launcher)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    #: exchange buffers reused between rounds (a buffer is reused only once no unpacked tensor views it)
    buffers: BufferPool = field(default_factory=BufferPool, repr=False, compare=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # -- collectives; identity with one process ------------------------------------------------------
    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        """Small Python objects (metadata) from the main process; in memory only, never from disk."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_tensors(self, tensors: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """The main process's ``tensors`` on every process (CPU)."""
        if not self.distributed:
            return tensors
        plan = plan_tensors(tensors) if self.is_main else None
        meta = self.broadcast_object(plan[0] if self.is_main else None)
        buffer = self.buffers.take(meta["nbytes"])
        if self.is_main:
            write_tensors(plan, buffer)
        dist.broadcast(buffer, src=0)
        return unpack_tensors(meta, buffer)

    def scatter_tensors(self, per_rank: list[dict[str, torch.Tensor]] | None) -> dict[str, torch.Tensor]:
        """``per_rank[r]`` (given on the main process) arrives on process ``r`` only."""
        if not self.distributed:
            return per_rank[0]
        plans = [plan_tensors(t) for t in per_rank] if self.is_main else None
        box = [None]
        dist.scatter_object_list(box, [meta for meta, _ in plans] if self.is_main else None, src=0)
        meta = box[0]
        size = self.broadcast_object(max(m["nbytes"] for m, _ in plans) if self.is_main else None)
        chunks = None
        if self.is_main:  # equal sizes for the collective; the tail past a part's own bytes is never read
            chunks = [write_tensors(plan, self.buffers.take(size)) for plan in plans]
        buffer = self.buffers.take(size)
        dist.scatter(buffer, scatter_list=chunks, src=0)
        return unpack_tensors(meta, buffer[: meta["nbytes"]])

    def gather_tensors(self, tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]] | None:
        """Every process's ``tensors`` on the main process (in rank order); ``None`` elsewhere."""
        if not self.distributed:
            return [tensors]
        plan = plan_tensors(tensors)
        metas = [None] * self.world_size
        dist.all_gather_object(metas, plan[0])
        size = max(m["nbytes"] for m in metas)
        # written once, straight into a buffer of the common size (reused across rounds: no page faults)
        buffer = write_tensors(plan, self.buffers.take(size))
        received = [self.buffers.take(size) for _ in range(self.world_size)] if self.is_main else None
        dist.gather(buffer, gather_list=received, dst=0)
        del buffer  # free for the next exchange
        if not self.is_main:
            return None
        return [unpack_tensors(m, b[: m["nbytes"]]) for m, b in zip(metas, received)]


def launcher_world_size() -> int:
    """The process count a launcher (accelerate, torchrun, MPI) announces and :func:`init_federated_process_group`
    has not yet taken over (it hides these variables): 1 outside a launch and after the group opened."""
    return int(os.environ.get("WORLD_SIZE", "1"))


MISSING_PROCESS_GROUP = (
    "this process is one of {world_size} launched processes, but the federated process group was not opened: "
    "call hf_fedflat.init_process_group() first thing in the script, before building FedTrainingArguments or any "
    "TrainingArguments (it must run before accelerate sets up, so that each process trains its own clients alone "
    "and meets the others only at round boundaries)."
)


def init_federated_process_group(use_cpu: bool = False) -> FederatedProcessGroup:
    """Open the exchange group once per process and hide the launch from accelerate/transformers.

    Entry points call it (as ``hf_fedflat.init_process_group()``) before anything builds ``TrainingArguments``.
    Idempotent. Without launcher variables (plain ``python``), returns a one-process group. On GPUs each
    process is pinned to its local device through ``CUDA_VISIBLE_DEVICES`` before CUDA initialises, so
    the single-process Trainer's ``cuda:0`` is that device (``use_cpu=True`` skips the pinning).
    """
    global _GROUP
    if _GROUP is not None:
        return _GROUP
    world_size = launcher_world_size()
    if world_size <= 1 or dist.is_initialized():
        _GROUP = FederatedProcessGroup(
            rank=dist.get_rank() if dist.is_initialized() else 0,
            world_size=dist.get_world_size() if dist.is_initialized() else 1,
        )
        if _GROUP.distributed:  # a group the caller opened: still hide the launch from accelerate
            _hide_launch()
        return _GROUP
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    # device_count() does not initialise CUDA (it asks NVML), so CUDA_VISIBLE_DEVICES still takes effect
    if not use_cpu and not torch.cuda.is_initialized() and _cuda_device_count() > 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(_cuda_device_count())]
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank % len(devices)]
    # gloo carries CPU tensors on every machine; the exchange is once per round, not per step.
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, timeout=timedelta(hours=2))
    _hide_launch()
    _GROUP = FederatedProcessGroup(rank=rank, world_size=world_size, local_rank=local_rank)
    return _GROUP


def _hide_launch() -> None:
    for name in _LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    # transformers warns on every TrainingArguments that our exchange group is "not DDP": by design
    from transformers.utils import logging as hf_logging

    target = hf_logging.get_logger("transformers.training_args")
    if not any(isinstance(f, _DropProcessGroupWarning) for f in target.filters):
        target.addFilter(_DropProcessGroupWarning())


class _DropProcessGroupWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "parallel_mode != ParallelMode.DISTRIBUTED" not in record.getMessage()


@contextlib.contextmanager
def quiet_process_group_warning():
    """transformers warns that our exchange group is "not DDP" on every ``TrainingArguments``: by design.

    (Once a distributed group is open the filter stays on; this also covers a group opened elsewhere.)"""
    from transformers.utils import logging as hf_logging

    target = hf_logging.get_logger("transformers.training_args")
    drop = _DropProcessGroupWarning()
    target.addFilter(drop)
    try:
        yield
    finally:
        target.removeFilter(drop)


def get_process_group() -> FederatedProcessGroup:
    """The group :func:`init_federated_process_group` opened; outside a launch, a one-process group on first use.

    Raises ``RuntimeError`` inside a multi-process launch whose entry point did not open the group."""
    if _GROUP is not None:
        return _GROUP
    if launcher_world_size() > 1:
        raise RuntimeError(MISSING_PROCESS_GROUP.format(world_size=launcher_world_size()))
    return init_federated_process_group()


def _cuda_device_count() -> int:
    try:
        return torch.cuda.device_count()
    except Exception:  # no driver
        return 0
