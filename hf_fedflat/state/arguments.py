"""Where per-client state lives (options of :func:`~hf_fedflat.state.create_client_state_store`) and what a
resume from a checkpoint may change: part of :class:`~hf_fedflat.FedTrainingArguments` (declared and checked here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..field_checks import check_choice, check_number, fail

__all__ = ["CLIENT_STATE_STORES", "ClientStateArguments"]

CLIENT_STATE_STORES = ("auto", "memory", "disk")


@dataclass
class ClientStateArguments:
    client_state_store: str = field(
        default="auto",
        metadata={"help": "Where per-client state (SCAFFOLD's c_i, ...) lives: memory, disk (one safetensors file "
                          "per client), or auto (memory until client_state_memory_mb is exceeded, then disk)."},
    )
    client_state_dir: str | None = field(
        default=None, metadata={"help": "Folder of the disk client-state store (default <output_dir>/client_states)."}
    )
    client_state_memory_mb: float = field(
        default=256.0,
        metadata={"help": "Memory budget of the 'auto' client-state store: states stay in memory up to it, every "
                          "further client's state goes to its own file on disk."},
    )

    allow_config_change: bool = field(
        default=False,
        metadata={"help": "Resume from a checkpoint although learning_rate, clients_per_round or lr_decay_per_round "
                          "differ from the checkpoint's, or num_rounds is below its round: the change is logged and "
                          "recorded (history.json, later checkpoints). Without it such a resume is refused. The "
                          "algorithm, its hyperparameters, num_clients, seed and partition can never change."},
    )

    def validate(self) -> None:
        check_number("client_state_memory_mb", self.client_state_memory_mb, low=0.0)
        if not isinstance(self.allow_config_change, bool):
            fail("allow_config_change", f"must be true or false, got {self.allow_config_change!r}.")
        check_choice("client_state_store", self.client_state_store, CLIENT_STATE_STORES)
