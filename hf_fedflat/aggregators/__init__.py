"""Server rules, and plug-ins that go in front of any of them (``+fedgh``).

Every module of this package is imported (and so registered) here, and every rule and plug-in it registers is
exported under its class name: a new rule is one new file. FedGH's harmonization is exported as a function too.
"""

from ..algorithms.base import registered_pieces

_PIECES = registered_pieces(__name__, __path__)
globals().update(_PIECES)
from .fedgh import gradient_conflicts, harmonize  # noqa: E402  (imported above; named here for the exports)

__all__ = sorted(_PIECES) + ["gradient_conflicts", "harmonize"]
