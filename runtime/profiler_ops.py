"""Operator-level profiles: charging the tensors an operator saves from its inputs.

A layer's ``saved_bytes`` leaves out its inputs (``activation_memory.py``). Between layers
that loses little, but inside a layer almost every activation is some operator's input: a
``Linear`` saves the ``LayerNorm`` output it reads, ``GELU`` its input. An operator-level
profile therefore charges a tensor that a reader saves to the operator that produced it,
once however many operators save it, and not again when the producer already saves its own
output (ReLU keeps its result). Each activation is then counted once, where it is made, as
DawnPiper's memory-balanced partition needs (Peng et al. 2025, §3); the model's data, which
the plan counts as ``input_bytes``, stays uncharged.
"""

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from pipestudio.planner import Layer
from pipestudio.runtime.models.spec import DATA


def saved_storages(layer: nn.Module, inputs: Sequence[Tensor]) -> tuple[set[int], bool]:
    """Storages (data pointers) one forward of ``layer`` saves for backward, and whether its
    own output is among them."""
    saved: set[int] = set()

    def pack(tensor: Tensor) -> Tensor:
        saved.add(tensor.untyped_storage().data_ptr())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = layer(*inputs)
    return saved, output.untyped_storage().data_ptr() in saved


class SavedInputs:
    """Who made each activation's storage, and which of them readers save, gathered while
    the operators are measured in order. A view (``getitem``, ``transpose``) makes no
    storage: saving it charges the operator that allocated the storage underneath."""

    def __init__(self, data: Tensor) -> None:
        self.owner: dict[int, str] = {data.untyped_storage().data_ptr(): DATA}
        self.charges: dict[str, dict[int, int]] = {}
        self.saves_own_output: set[str] = set()

    def record(self, name: str, layer: nn.Module, inputs: Sequence[Tensor], output: Tensor) -> None:
        """Note what ``layer`` saves of ``inputs``, and ``output``'s storage if it made one."""
        sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in inputs}
        saved, own = saved_storages(layer, inputs)
        for ptr in saved & set(sizes):
            owner = self.owner.get(ptr, DATA)
            if owner != DATA:
                self.charges.setdefault(owner, {})[ptr] = sizes[ptr]
        out_ptr = output.untyped_storage().data_ptr()
        if out_ptr not in sizes:
            self.owner[out_ptr] = name
            if own:
                self.saves_own_output.add(name)

    def charged(self, layers: Iterable[Layer]) -> list[Layer]:
        """``layers`` with each saved storage added to its maker's ``saved_bytes``."""
        return [
            layer
            if layer.name in self.saves_own_output
            else layer.model_copy(
                update={
                    "saved_bytes": layer.saved_bytes
                    + sum(self.charges.get(layer.name, {}).values())
                }
            )
            for layer in layers
        ]
