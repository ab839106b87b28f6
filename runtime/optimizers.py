"""The optimizers a plan may name, by the names the planner's memory model uses.

``sgd``, ``momentum`` and ``adam`` keep 0, 1 and 2 tensors of state per parameter, which is
what ``pipestudio.planner.formats.plan.OPTIMIZER_STATE_FACTOR`` counts.
"""

from collections.abc import Callable, Iterable

import torch

from pipestudio.runtime.errors import SettingsError

OPTIMIZERS: dict[str, Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01),
    "momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
}


def make_optimizer(name: str, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``params``, with the runtime's default learning rates."""
    if name not in OPTIMIZERS:
        raise SettingsError(
            f"optimizer {name!r} is unknown; expected one of {', '.join(OPTIMIZERS)}"
        )
    return OPTIMIZERS[name](params)
