"""What a layer holds in memory for training: bytes saved for backward, and its workspace.

Saved bytes are what the planner charges a layer under the ``keep`` policy, between its
forward and its backward. They are counted exactly, from the tensors autograd packs during
one forward (``torch.autograd.graph.saved_tensors_hooks``), each storage once, so views of
one buffer (q, k and v split from one projection) are not counted three times.

Two kinds of saved tensor are left out, because the plan accounts for them elsewhere:
the layer's parameters and buffers (static memory: weights, and BatchNorm's running
statistics) and the layer's inputs, which are the previous layer's output (its
``output_bytes``) or, for a recomputed run of layers, the checkpoint kept at its start.
A tensor a layer saves that is also its output (ReLU keeps its result) does count: it stays
alive for the backward after the next stage has consumed the output.
"""

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


def tensor_bytes(tensor: Tensor) -> int:
    return tensor.element_size() * tensor.numel()


def count_saved_bytes(layer: nn.Module, inputs: Sequence[Tensor]) -> tuple[Tensor, int]:
    """Run ``layer(*inputs)`` once; its output and the bytes it saved for backward.

    Storages are told apart by their data pointer: while the output (and so the autograd
    graph) is alive, no two saved storages can share an address.
    """
    excluded = {
        t.untyped_storage().data_ptr() for t in (*layer.parameters(), *layer.buffers(), *inputs)
    }
    saved: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = layer(*inputs)
    return output, sum(saved.values())


def measure_workspace_bytes(
    forward_backward: Callable[[], object],
    device: torch.device,
    *,
    output_bytes: int,
    saved_bytes: int,
) -> int:
    """Transient bytes of one forward and backward on CUDA: the peak allocation above what
    was allocated before, less the output and saved tensors the plan already counts.

    Call it with the parameters' gradients already allocated (after a backward), so that
    they, which the plan counts as static memory, are not mistaken for workspace. What
    remains includes the input gradient sent upstream and, for a layer with parameters, the
    fresh weight gradient that autograd adds into ``.grad``: both are transient on every
    micro-batch but the first of a step. On CPU PyTorch keeps no allocation statistics and
    the answer is 0.
    """
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    forward_backward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return max(0, peak - before - output_bytes - saved_bytes)
