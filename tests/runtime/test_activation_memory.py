"""Saved bytes counted by hand on small layers (activation_memory.py)."""

import torch
from torch import Tensor, nn

from pipestudio.runtime.activation_memory import count_saved_bytes, measure_workspace_bytes

BATCH, WIDTH = 4, 16
FLOAT_BYTES = 4


class SplitMul(nn.Module):
    """Saves two views of one projection: their storage must count once."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 2 * WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.proj(x).chunk(2, dim=1)
        return a * b


def saved(layer: nn.Module) -> int:
    x = torch.randn(BATCH, 8, requires_grad=True)
    output, saved_bytes = count_saved_bytes(layer, [x])
    assert output.shape[0] == BATCH
    return saved_bytes


def test_inputs_and_parameters_are_not_counted() -> None:
    assert saved(nn.Linear(8, WIDTH)) == 0  # keeps its input and weight only
    assert saved(nn.GELU()) == 0  # keeps its input only


def test_intermediate_activations_are_counted() -> None:
    # GELU keeps its input, the Linear's output: batch x width floats.
    assert saved(nn.Sequential(nn.Linear(8, WIDTH), nn.GELU())) == BATCH * WIDTH * FLOAT_BYTES


def test_a_saved_output_counts() -> None:
    # ReLU keeps its result, which is also the layer's output.
    assert saved(nn.Sequential(nn.Linear(8, WIDTH), nn.ReLU())) == BATCH * WIDTH * FLOAT_BYTES


def test_views_of_one_storage_count_once() -> None:
    assert saved(SplitMul()) == BATCH * 2 * WIDTH * FLOAT_BYTES


def test_workspace_is_zero_on_cpu() -> None:
    assert (
        measure_workspace_bytes(
            lambda: torch.ones(1000), torch.device("cpu"), output_bytes=0, saved_bytes=0
        )
        == 0
    )
