"""How many clients one process trains at once (``concurrent_clients``): part of
:class:`~hf_fedflat.FedTrainingArguments` (declared and checked here; the machinery is :mod:`.lanes`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..field_checks import check_integer

__all__ = ["ConcurrencyArguments"]


@dataclass
class ConcurrencyArguments:
    concurrent_clients: int = field(
        default=1,
        metadata={"help": "Clients of its round share this process trains at once, each in its own model replica and "
                          "local Trainer (a thread; on CUDA its own stream). The same weights as 1, bit for bit on a "
                          "CPU (the step and the data fetch, which draw random numbers, take turns); memory: one more "
                          "model, optimizer state and activations per extra client. For small models on a GPU; also "
                          "see accelerate_configs/single_gpu_4proc.yaml (several processes on one GPU)."},
    )

    def validate(self) -> None:
        check_integer("concurrent_clients", self.concurrent_clients, low=1)
