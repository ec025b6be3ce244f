"""No perturbation (ERM): the step follows the minibatch gradient."""

from ..algorithms.base import GradFn, Perturbation, Tensor
from ..algorithms.registry import register_perturbation


@register_perturbation
class NoPerturbation(Perturbation):
    """``d = g``. One forward and backward pass per step."""

    name = "none"
    passes_per_step = 1
    is_identity = True

    @classmethod
    def from_args(cls, args) -> "NoPerturbation":
        return cls()

    def direction(self, grad_at: GradFn, workspace) -> tuple[Tensor, Tensor]:
        return grad_at(None)

    def fixed_offset(self, workspace) -> None:
        return None
