"""A backward in two halves, as zero-bubble schedules run it: the input gradients first, the
weight gradients later.

During the forward, ``capturing`` keeps the output of every module that holds parameters
of its own (a Linear, a convolution, a norm, an embedding: ``weight_modules``). The input
half asks autograd for the gradients of what the caller names (the inputs to hand
upstream) and of those outputs, keeping the graph: autograd runs only the nodes that lead
there, so an op's weight gradient (a matmul's dW) is not computed. The weight half then
asks, module by module, for its own parameters' gradients from its output's gradient: the
module's own nodes only. Together they cost what one backward does; the graph goes when
the micro-batch's work is dropped. A module called twice (shared weights) is captured twice, and its
gradients add up.

The engine's stages (``engine/execution/stage.py``) and the profiler's ``bwd_weight_ms``
(``profiler.py``) both split a backward this way.
"""

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


def weight_modules(root: nn.Module) -> list[nn.Module]:
    """The modules under ``root`` (itself included) with parameters of their own that
    take a gradient."""
    return [
        module
        for module in root.modules()
        if any(p.requires_grad for p in module.parameters(recurse=False))
    ]


@dataclass
class WeightWork:
    """What the weight half needs: per captured call, the module's parameters, its
    outputs and their gradients (``input_half`` fills the gradients)."""

    calls: list[tuple[list[nn.Parameter], list[Tensor]]] = field(default_factory=list)
    grads: list[list[Tensor | None]] = field(default_factory=list)


@contextlib.contextmanager
def capturing(modules: Sequence[nn.Module], work: WeightWork) -> Iterator[None]:
    """Record each call of ``modules`` in ``work`` (outputs that ask for a gradient)."""

    def hook(module: nn.Module, _: object, output: object) -> None:
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        tensors = [t for t in outputs if isinstance(t, Tensor) and t.requires_grad]
        if tensors:
            params = [p for p in module.parameters(recurse=False) if p.requires_grad]
            work.calls.append((params, tensors))

    handles = [module.register_forward_hook(hook) for module in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def input_half(
    roots: Sequence[Tensor],
    root_grads: Sequence[Tensor | None],
    inputs: Sequence[Tensor],
    work: WeightWork,
    now: Sequence[Tensor] = (),
) -> tuple[tuple[Tensor | None, ...], tuple[Tensor | None, ...]]:
    """The gradients of ``inputs`` and of ``now`` (parameters whose gradients cannot wait:
    those of recomputed layers, whose outputs are remade inside this pass), keeping what
    the weight half needs in ``work``."""
    outputs = [t for _, tensors in work.calls for t in tensors]
    wanted = [*inputs, *now, *outputs]
    if not roots or not wanted:
        return (None,) * len(inputs), (None,) * len(now)
    results = torch.autograd.grad(
        list(roots), wanted, list(root_grads), retain_graph=True, allow_unused=True
    )
    rest: list[Tensor | None] = list(results[len(inputs) + len(now) :])
    work.grads = []
    for _, tensors in work.calls:
        work.grads.append(rest[: len(tensors)])
        rest = rest[len(tensors) :]
    return results[: len(inputs)], results[len(inputs) : len(inputs) + len(now)]


def weight_half(work: WeightWork) -> None:
    """Each captured call's parameters' gradients, from its outputs' gradients, added into
    their ``.grad`` by autograd itself: in place once a gradient is there (a fresh buffer
    per gradient, then another for the sum, cost a third of the half on a CPU)."""
    for (params, outputs), grads in zip(work.calls, work.grads, strict=True):
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None]
        if not pairs or not params:
            continue
        # a module with parameters of its own may hold one that does too: its call's
        # nodes lie under the outer one's, so the graph stays until the work is dropped
        torch.autograd.backward(
            [o for o, _ in pairs], [g for _, g in pairs], retain_graph=True, inputs=params
        )
    work.calls.clear()
    work.grads.clear()


def accumulate(gradients: Sequence[tuple[nn.Parameter, Tensor]]) -> None:
    """Add gradients into their parameters' ``.grad`` (in place once there is one)."""
    for param, grad in gradients:
        if param.grad is None:
            param.grad = grad
        else:
            param.grad.add_(grad)
