"""One stage's layers: the forward of a micro-batch under the plan's memory policies, and its
backward with the gradients that came back.

Layers run in model order on the tensors they read: received ones (leaves that ask for a
gradient when they are floating point), the data (drawn locally), and outputs of earlier
layers of the stage. Each layer runs on the weights it is given: the live parameters
(synchronous schedules) or a stashed version (``weights.py``), through
``torch.func.functional_call``, so a recomputation during the backward runs on the same
version as the forward did.

Policies (``pipestudio.planner.simulator.costs``): ``keep`` layers run as they are; each run of
consecutive ``recompute`` layers runs under ``torch.utils.checkpoint`` (non-reentrant), which
keeps only the run's inputs and repeats its forward during the backward (GPipe's
rematerialization); ``swap`` layers run inside the ``SwapSpace``'s saved-tensor hooks.

The backward on the live parameters lets autograd accumulate into their ``.grad``, as
``loss.backward()`` does; on a stashed version it uses ``torch.autograd.grad`` towards the
weights and received inputs, so the gradients of micro-batches that share one version never
mix, and the caller adds them into the live parameters' ``.grad``.

``zero-bubble`` splits the backward in two (``backward_input``, ``backward_weight``;
``runtime/backward_split.py``): the forward keeps the output of every module with
parameters of its own outside recompute blocks; the input half computes the received
inputs' gradients, those outputs' and the recompute blocks' parameters' (their layers'
outputs are remade inside the backward, out of reach); the weight half, later, each
module's parameters' gradients from its output's. The profiler measures ``bwd_weight_ms``
the same way.
"""

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from pipestudio.runtime.backward_split import (
    WeightWork,
    accumulate,
    capturing,
    input_half,
    weight_half,
    weight_modules,
)
from pipestudio.runtime.batchnorm import recomputation
from pipestudio.runtime.engine.execution.swap import SwapSpace
from pipestudio.runtime.engine.execution.weights import trainable
from pipestudio.runtime.engine.layout import DATA, StageIO
from pipestudio.runtime.engine.telemetry.metrics import Recorder
from pipestudio.runtime.precision import forwards


@dataclass
class ForwardState:
    """What the backward of a micro-batch needs from its forward."""

    microbatch: int
    step: int
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    loss: Tensor | None
    weights: Mapping[str, Tensor]
    #: zero-bubble: the calls of modules with parameters, for the weight half.
    weight_work: WeightWork | None = None


class StageRunner:
    """Forward and backward of one stage (see the module docstring)."""

    def __init__(
        self,
        layers: Mapping[str, nn.Module],
        io: StageIO,
        graph_inputs: Mapping[str, Sequence[str]],
        loss_fn: Callable[..., Tensor],
        num_microbatches: int,
        device: torch.device,
        swap: SwapSpace,
        recorder: Recorder,
        precision: str = "fp32",
        split_backward: bool = False,
    ) -> None:
        self.io, self.names = io, list(io.layers)
        self.device, self.precision = device, precision
        self.module = nn.ModuleList([layers[name] for name in self.names]).to(device)
        self.inputs = {name: list(graph_inputs[name]) for name in self.names}
        self.loss_fn, self.num_microbatches = loss_fn, num_microbatches
        self.swap, self.recorder = swap, recorder
        self.params = dict(self.module.named_parameters())
        self._layer_keys = [
            [key for key in self.params if key.split(".", 1)[0] == str(pos)]
            for pos in range(len(self.names))
        ]
        self.blocks = _split_blocks(self.names, io.policies)
        self._needed = self._needed_after_blocks()
        #: zero-bubble (module docstring): the modules whose calls the forward keeps, and
        #: the parameters the input half computes itself (those of recompute blocks).
        self.split_backward = split_backward
        self._weight_modules = [
            module
            for policy, positions in self.blocks
            if policy != "recompute"
            for pos in positions
            for module in weight_modules(self.module[pos])
        ]
        self._recomputed_keys = [
            key
            for policy, positions in self.blocks
            if policy == "recompute"
            for pos in positions
            for key in self._layer_keys[pos]
        ]

    def _needed_after_blocks(self) -> list[set[str]]:
        """Names each block must hand on: read later in the stage, sent, or the output."""
        keep_to_end = {t.layer for t in self.io.sends}
        if self.io.has_loss:
            keep_to_end.add(self.names[-1])
        needed = []
        for idx in range(len(self.blocks)):
            later = {
                src
                for _, positions in self.blocks[idx + 1 :]
                for pos in positions
                for src in self.inputs[self.names[pos]]
            }
            needed.append(later | keep_to_end)
        return needed

    def _call(self, pos: int, args: list[Tensor], weights: Mapping[str, Tensor]) -> Tensor:
        module = self.module[pos]
        if weights is self.params:
            return module(*args)
        prefix = len(str(pos)) + 1
        return functional_call(
            module, {key[prefix:]: weights[key] for key in self._layer_keys[pos]}, tuple(args)
        )

    def static_storages(self, weights: Mapping[str, Tensor]) -> set[int]:
        tensors = [*weights.values(), *self.module.buffers()]
        return {tensor.untyped_storage().data_ptr() for tensor in tensors}

    def forward(
        self,
        microbatch: int,
        step: int,
        received: dict[str, Tensor],
        data: Tensor | None,
        targets: Tensor | None,
        weights: Mapping[str, Tensor],
        before_layer: Callable[[str], None] | None = None,
    ) -> ForwardState:
        """The micro-batch's forward in the plan's precision (``runtime/precision.py``;
        a recomputation repeats it: ``checkpoint`` restores the autocast state);
        ``before_layer(name)`` is called before each layer runs (a layer that migrated
        here may still be arriving: ``migration/executor.py``)."""
        work = WeightWork() if self.split_backward else None
        with (
            forwards(self.precision, self.device),
            capturing(self._weight_modules, work) if work is not None else contextlib.nullcontext(),
        ):
            state = self._forward(microbatch, step, received, data, targets, weights, before_layer)
        state.weight_work = work
        return state

    def _forward(
        self,
        microbatch: int,
        step: int,
        received: dict[str, Tensor],
        data: Tensor | None,
        targets: Tensor | None,
        weights: Mapping[str, Tensor],
        before_layer: Callable[[str], None] | None,
    ) -> ForwardState:
        acts: dict[str, Tensor] = dict(received)
        if data is not None:
            acts[DATA] = data
        static = self.static_storages(weights) if "swap" in self.io.policies.values() else set()
        for idx, (policy, positions) in enumerate(self.blocks):
            if before_layer is not None:
                for pos in positions:
                    before_layer(self.names[pos])
            if policy == "recompute":
                self._recompute_block(idx, acts, weights, microbatch, step)
            else:
                name = self.names[positions[0]]
                args = [acts[src] for src in self.inputs[name]]
                if policy == "swap":
                    with self.swap.saving(microbatch, static, tuple(args)):
                        acts[name] = self._call(positions[0], args, weights)
                else:
                    acts[name] = self._call(positions[0], args, weights)
            for name in [name for name in acts if name not in self._needed[idx]]:
                del acts[name]
        loss = None
        if self.io.has_loss:
            assert targets is not None
            loss = self.loss_fn(acts[self.names[-1]], targets) / self.num_microbatches
        outputs = {t.layer: acts[t.layer] for t in self.io.sends}
        return ForwardState(microbatch, step, received, outputs, loss, weights)

    def _recompute_block(
        self,
        idx: int,
        acts: dict[str, Tensor],
        weights: Mapping[str, Tensor],
        microbatch: int,
        step: int,
    ) -> None:
        positions = self.blocks[idx][1]
        made = {self.names[pos] for pos in positions}
        outside = sorted(
            {src for pos in positions for src in self.inputs[self.names[pos]] if src not in made}
        )
        handed_on = [self.names[pos] for pos in positions if self.names[pos] in self._needed[idx]]
        calls = [0]

        def run(*args: Tensor) -> tuple[Tensor, ...]:
            calls[0] += 1
            start = self.recorder.marker.mark() if calls[0] > 1 else None
            # a recomputation must not count twice in deferred BatchNorm's statistics
            again = recomputation() if calls[0] > 1 else contextlib.nullcontext()
            try:
                local = dict(zip(outside, args, strict=True))
                with again:
                    for pos in positions:
                        name = self.names[pos]
                        local[name] = self._call(
                            pos, [local[src] for src in self.inputs[name]], weights
                        )
                return tuple(local[name] for name in handed_on)
            finally:
                if start is not None:
                    self.recorder.span(
                        "recompute", microbatch, step, start, self.recorder.marker.mark()
                    )

        results = checkpoint(run, *[acts[src] for src in outside], use_reentrant=False)
        acts.update(zip(handed_on, results, strict=True))

    def backward(
        self,
        state: ForwardState,
        grads: Mapping[str, Tensor],
        hand_on_first: Callable[[dict[str, Tensor]], None] | None = None,
        loss_scale: float | None = None,
    ) -> tuple[dict[str, Tensor | None], dict[str, Tensor]]:
        """Gradients of the weights (by parameter name) and of the received inputs; with
        ``loss_scale`` (fp16, ``scaling.py``) those of ``loss_scale`` times the loss.

        On the live parameters (synchronous schedules) autograd adds the weights' gradients
        into their ``.grad`` itself, as each is made, and none are returned: collecting
        them all and adding them afterwards cost a third more time on the CPU (fresh
        buffers for every gradient, then a pass over each). Stashed versions get theirs
        returned, to be added by the caller (``weights.set_gradients``).

        With ``hand_on_first`` (live parameters only) the received inputs' gradients are
        computed first and handed to it, then the weights' in a second pass over the
        graph: the previous stage, waiting for them, starts sooner, for more work here
        (the second pass repeats what lies between the two)."""
        roots, root_grads = self._roots(state, grads, loss_scale)
        wrt = trainable(state.weights)
        leaves = [(name, leaf) for name, leaf in state.inputs.items() if leaf.requires_grad]
        weights, inputs = [t for _, t in wrt], [t for _, t in leaves]
        if not roots or not (wrt or leaves):
            return {}, self._input_grads(state, leaves, [None] * len(leaves))
        if state.weights is not self.params:  # a stashed version
            results = torch.autograd.grad(roots, weights + inputs, root_grads, allow_unused=True)
            return (
                {name: grad for (name, _), grad in zip(wrt, results, strict=False)},
                self._input_grads(state, leaves, results[len(wrt) :]),
            )
        if hand_on_first is not None and leaves:
            hand_on_first(
                self._input_grads(
                    state,
                    leaves,
                    torch.autograd.grad(
                        roots, inputs, root_grads, retain_graph=True, allow_unused=True
                    ),
                )
            )
            if wrt:
                torch.autograd.backward(roots, root_grads, inputs=weights)
            return {}, {}
        torch.autograd.backward(roots, root_grads, inputs=weights + inputs)
        return {}, self._input_grads(state, leaves, [leaf.grad for _, leaf in leaves])

    def backward_input(
        self,
        state: ForwardState,
        grads: Mapping[str, Tensor],
        loss_scale: float | None = None,
    ) -> tuple[dict[str, Tensor], WeightWork]:
        """The input half of a split backward (module docstring): the received inputs'
        gradients, and what the weight half needs; the recompute blocks' parameters get
        their gradients (into ``.grad``) here."""
        roots, root_grads = self._roots(state, grads, loss_scale)
        leaves = [(name, leaf) for name, leaf in state.inputs.items() if leaf.requires_grad]
        recomputed = [
            self.params[key] for key in self._recomputed_keys if self.params[key].requires_grad
        ]
        work = state.weight_work or WeightWork()
        state.weight_work = None
        leaf_grads, now = input_half(
            roots, root_grads, [leaf for _, leaf in leaves], work, recomputed
        )
        accumulate([(p, g) for p, g in zip(recomputed, now, strict=True) if g is not None])
        return self._input_grads(state, leaves, leaf_grads), work

    @staticmethod
    def backward_weight(work: WeightWork) -> None:
        """The weight half: the captured modules' parameters' gradients, added into their
        ``.grad``."""
        weight_half(work)

    @staticmethod
    def _roots(
        state: ForwardState, grads: Mapping[str, Tensor], loss_scale: float | None
    ) -> tuple[list[Tensor], list[Tensor | None]]:
        """What the backward starts from: the loss (scaled under fp16) and the sent
        outputs with the gradients that came back for them."""
        roots: list[Tensor] = []
        root_grads: list[Tensor | None] = []
        if state.loss is not None:
            roots.append(state.loss)
            root_grads.append(
                None if loss_scale is None else torch.full_like(state.loss, loss_scale)
            )
        for layer, grad in grads.items():
            if state.outputs[layer].requires_grad:
                roots.append(state.outputs[layer])
                root_grads.append(grad)
        return roots, root_grads

    @staticmethod
    def _input_grads(
        state: ForwardState, leaves: list[tuple[str, Tensor]], leaf_grads: Sequence[Tensor | None]
    ) -> dict[str, Tensor]:
        """The gradient of every floating-point input received (zeros where none flowed)."""
        input_grads = {
            name: torch.zeros_like(state.inputs[name])
            for name in state.inputs
            if state.inputs[name].is_floating_point()
        }
        for (name, _), grad in zip(leaves, leaf_grads, strict=True):
            if grad is not None:
                input_grads[name] = grad
        return input_grads


def _split_blocks(names: list[str], policies: Mapping[str, str]) -> list[tuple[str, list[int]]]:
    """Consecutive recompute layers form one block; every other layer is a block alone."""
    blocks: list[tuple[str, list[int]]] = []
    for pos, name in enumerate(names):
        policy = policies[name]
        if policy == "recompute" and blocks and blocks[-1][0] == "recompute":
            blocks[-1][1].append(pos)
        else:
            blocks.append((policy, [pos]))
    return blocks
