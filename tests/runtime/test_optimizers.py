"""The optimizers keep the state the planner's memory model charges (optimizers.py)."""

import pytest
import torch

from pipestudio.planner.formats.plan import OPTIMIZER_STATE_FACTOR
from pipestudio.runtime.errors import SettingsError
from pipestudio.runtime.optimizers import OPTIMIZERS, make_optimizer


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_per_parameter_matches_the_planner(name: str) -> None:
    param = torch.nn.Parameter(torch.randn(3, 5))
    param.grad = torch.ones_like(param)
    optimizer = make_optimizer(name, [param])
    optimizer.step()
    state = optimizer.state[param]
    per_element = [
        value
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.shape == param.shape
    ]
    assert len(per_element) == OPTIMIZER_STATE_FACTOR[name]


def test_unknown_optimizer_is_named() -> None:
    with pytest.raises(SettingsError, match="optimizer 'lamb' is unknown; expected one of sgd"):
        make_optimizer("lamb", [])
