"""The opt-in measurements' options, part of :class:`~hf_fedflat.FedTrainingArguments` (declared and checked here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..field_checks import check_integer, check_number, fail

__all__ = ["DIAGNOSTICS", "DiagnosticsArguments", "parse_diagnostics"]

DIAGNOSTICS = ("train_accuracy", "client_accuracy", "sharpness", "perturbation_drift", "gradient_conflict", "loss_surface")


def parse_diagnostics(value: str | None) -> list[str]:
    """The comma-separated ``diagnostics`` field as a list."""
    return [d.strip() for d in (value or "").split(",") if d.strip()]


@dataclass
class DiagnosticsArguments:
    """What :class:`~hf_fedflat.diagnostics.RunDiagnostics` measures besides bytes and time to target."""

    diagnostics: str = field(
        default="",
        metadata={"help": "Comma-separated opt-in measurements logged to history.json: "
                          f"{', '.join(DIAGNOSTICS)}. Bytes per round and time to target_accuracy are always logged."},
    )
    diagnostics_num_samples: int = field(
        default=1024,
        metadata={"help": "Training samples used by train_accuracy / sharpness / loss_surface (a fixed random subset)."},
    )
    loss_surface_resolution: int = field(
        default=11, metadata={"help": "loss_surface: grid points per axis over [-1, 1] x [-1, 1]."}
    )
    target_accuracy: float | None = field(
        default=None, metadata={"help": "Log the round and wall time at which eval accuracy first reaches this value."}
    )

    def validate(self) -> None:
        unknown = [d for d in parse_diagnostics(self.diagnostics) if d not in DIAGNOSTICS]
        if unknown:
            fail("diagnostics", f"unknown {unknown}; choose from {', '.join(DIAGNOSTICS)} (comma-separated).")
        check_integer("diagnostics_num_samples", self.diagnostics_num_samples, low=1)
        check_integer("loss_surface_resolution", self.loss_surface_resolution, low=2)
        if self.target_accuracy is not None:
            check_number("target_accuracy", self.target_accuracy, low=0.0, high=1.0)
