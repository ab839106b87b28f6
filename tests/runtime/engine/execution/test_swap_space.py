"""The swap space moves what the profiler counts, and rebuilds every saved view exactly.

A CPU space made with ``rehearse=True`` copies the storages out and back as a GPU's does,
so the views it rebuilds (attention saves several views of one projection) are checked
against plain autograd here, without a GPU.
"""

import pytest
import torch
from torch import Tensor, nn

from pipestudio.runtime.activation_memory import count_saved_bytes
from pipestudio.runtime.engine.execution.swap import SwapSpace
from pipestudio.runtime.models import load_model
from pipestudio.runtime.precision import forwards

CPU = torch.device("cpu")
GPT = {"layers": "2", "width": "64", "heads": "4", "seq_len": "16", "vocab": "128"}


def _layers(precision: str) -> list[tuple[str, nn.Module, tuple[Tensor, ...]]]:
    """Each gpt layer with the input it gets from the layer before (detached)."""
    spec = load_model("gpt", GPT)
    data, _ = spec.sample(2, 0)
    layers = []
    inputs: tuple[Tensor, ...] = (data,)
    for name, layer in spec.layers:
        layers.append((name, layer, inputs))
        with torch.no_grad(), forwards(precision, CPU):
            output = layer(*inputs)
        inputs = (output.detach().requires_grad_(output.is_floating_point()),)
    return layers


def _grads(
    layer: nn.Module, inputs: tuple[Tensor, ...], precision: str, space: SwapSpace | None
) -> list[Tensor]:
    fresh = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
    layer.zero_grad(set_to_none=True)
    static = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), *layer.buffers())}
    with forwards(precision, CPU):
        if space is None:
            output = layer(*fresh)
        else:
            with space.saving(0, static, fresh):
                output = layer(*fresh)
            space.swap_out(0)
            space.swap_in(0)
    output.float().square().sum().backward()
    grads = [p.grad.clone() for p in layer.parameters() if p.grad is not None]
    return grads + [t.grad for t in fresh if t.grad is not None]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_swapped_bytes_are_the_profiled_saved_bytes(precision: str) -> None:
    """Inputs stay, every storage moves once: bytes moved = the profile's ``saved_bytes``."""
    for name, layer, inputs in _layers(precision):
        space = SwapSpace(CPU, rehearse=True)
        static = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), *layer.buffers())}
        with forwards(precision, CPU):
            with space.saving(0, static, inputs):
                layer(*inputs)
            _, profiled = count_saved_bytes(layer, inputs)
        assert space.num_bytes(0) == profiled, name


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_swapped_out_and_back_changes_no_gradient(precision: str) -> None:
    for name, layer, inputs in _layers(precision):
        plain = _grads(layer, inputs, precision, None)
        space = SwapSpace(CPU, rehearse=True)
        swapped = _grads(layer, inputs, precision, space)
        assert space.on_host(0) is False and space.num_bytes(0) > 0
        assert len(plain) == len(swapped)
        for expected, got in zip(plain, swapped, strict=True):
            assert torch.equal(expected, got), name


def test_views_of_one_storage_move_once_and_come_back_as_views() -> None:
    """Two saved views of one storage: one copy each way, both rebuilt from it."""
    space = SwapSpace(CPU, rehearse=True)
    base = torch.randn(4, 6, requires_grad=True)
    weight = torch.randn(6, 6, requires_grad=True)
    with space.saving(0, set()):
        made = base * 2  # a storage made inside the layer
        left, right = made[:, :3], made[:, 3:]
        out = (left @ right.t()).sum() + (made.t() @ made).sum()
    assert space.num_bytes(0) == made.untyped_storage().nbytes()
    space.swap_out(0)
    assert space.on_host(0)
    space.swap_in(0)
    out.backward()
    expected_base = base.grad.clone()
    base.grad = None
    made = base * 2
    ((made[:, :3] @ made[:, 3:].t()).sum() + (made.t() @ made).sum()).backward()
    assert torch.equal(expected_base, base.grad)
    del weight


def test_without_rehearsal_a_cpu_space_moves_nothing() -> None:
    space = SwapSpace(CPU)
    x = torch.randn(3, 3, requires_grad=True)
    with space.saving(0, set()):
        y = (x * 2).sin()
    assert space.swap_out(0) is None and not space.on_host(0)
    y.sum().backward()
    assert space.num_bytes(0) > 0
