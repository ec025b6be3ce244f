"""Checks shared by every configuration dataclass: a bad value raises ``ConfigError("<field>: <what to do>")``.

The argument dataclasses (:mod:`hf_fedflat.config`, :mod:`hf_fedflat.data.arguments`, the diagnostics and
client-state options, each piece's hyperparameters) validate with these, so every message starts with the
field's name, before any data or model loads. :class:`ConfigError` is a ``ValueError``; the command line reports
it as one line and exit status 2 (:mod:`hf_fedflat.cli.exit_codes`), wherever it is raised before training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["ConfigError", "check_choice", "check_integer", "check_number", "fail"]


class ConfigError(ValueError):
    """A setting is refused: a flag's or config file's value, or one that the algorithm, the data or the model
    contradicts. The message starts with the field's (or the file's) name; raised before training starts."""


def fail(name: str, message: str):
    """Raise ``ConfigError("<name>: <message>")`` (a ``ValueError``)."""
    raise ConfigError(f"{name}: {message}")


def check_integer(name: str, value: Any, low: int = 1, high: int | None = None) -> None:
    """An integer (not a bool) ``>= low`` (and ``<= high`` when given)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in {low}..{high}"
        fail(name, f"must be an integer {bounds}, got {value!r}.")


def check_number(name: str, value: Any, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> None:
    """A finite number in ``[low, high]`` (an open end with ``low_open`` / ``high_open``); either bound may be
    left out."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        fail(name, f"must be a finite number, got {value!r}.")
    if low is not None and (value <= low if low_open else value < low):
        fail(name, f"must be {'>' if low_open else '>='} {low}, got {value}.")
    if high is not None and (value >= high if high_open else value > high):
        fail(name, f"must be {'<' if high_open else '<='} {high}, got {value}.")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """One of ``choices``."""
    if value not in choices:
        fail(name, f"must be one of {tuple(choices)}, got {value!r}.")
