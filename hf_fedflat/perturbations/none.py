"""No perturbation (ERM): the step follows the minibatch gradient."""

from ..algorithms.base import FixedOffsetPerturbation, register_perturbation


@register_perturbation
class NoPerturbation(FixedOffsetPerturbation):
    """``d = g``: the gradient at ``w`` itself. One forward and backward pass per step; no hyperparameters."""

    name = "none"

    def offset(self, workspace) -> None:
        return None
