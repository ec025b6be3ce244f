"""The preset table of README.md and docs/algorithms.md, generated from the registry.

    python -m hf_fedflat.algorithms.preset_table        # prints the Markdown table

One row per registered preset (server presets in registry order, then the decentralized ones): its
perturbation, corrections and aggregator as the :class:`~hf_fedflat.algorithms.registry.AlgorithmSpec` names
them, the perturbation's forward+backward passes per optimizer step, and a short form of the spec's paper
reference. ``tests/test_docs.py`` checks that both documents hold exactly this text.
"""

from __future__ import annotations

import re

__all__ = ["preset_table", "short_reference"]

HEADER = ("preset", "perturbation", "corrections", "aggregator", "passes/step", "paper")
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")


def short_reference(paper: str) -> str:
    """``"McMahan et al., <title>, AISTATS 2017"`` -> ``"McMahan et al., AISTATS 2017"``; a reference that names
    no authors -> its name (the text before the first ``:`` or ``(``) and its year (``"FedUp, 2024"``)."""
    parts = [part.strip() for part in paper.split(",")]
    if parts[0].endswith("et al."):
        return f"{parts[0]}, {parts[-1]}"
    name = re.split(r"[:(]", paper, maxsplit=1)[0].strip()
    year = _YEAR.search(paper)
    return f"{name}, {year.group(0)}" if year else name


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def preset_table() -> str:
    """The Markdown table of every registered preset (no trailing newline)."""
    import hf_fedflat  # noqa: F401  (registers every preset, the decentralized ones included)

    from .registry import AGGREGATORS, PERTURBATIONS, PRESETS, get_preset, split_plugins

    def decentralized(spec) -> bool:
        cls = AGGREGATORS.get(split_plugins(spec.aggregator)[0])
        return bool(cls is not None and cls.capabilities.decentralized)

    specs = sorted((get_preset(name) for name in PRESETS), key=decentralized)  # (stable: registry order within)
    rows = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for spec in specs:
        cells = (
            f"`{spec.name}`",
            spec.perturbation,
            ", ".join(spec.corrections) or "–",
            spec.aggregator,
            str(PERTURBATIONS[spec.perturbation].passes_per_step),
            short_reference(spec.paper) if spec.paper else "–",
        )
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(preset_table())
