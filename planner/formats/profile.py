"""The Profile format: per-layer times and sizes of a model at one micro-batch size.

A profile lists layers in a topological order. Without ``edges`` it is a chain (each layer
feeds the next); with ``edges`` it is a DAG and every edge must point forward in the list.
Times scale linearly with the micro-batch size, and so do activation sizes; parameters do
not (``Profile.rescaled``).
"""

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from pipestudio.planner.errors import ProfileError
from pipestudio.planner.formats.documents import (
    MAX_EDGES,
    MAX_LAYERS,
    MAX_MICROBATCH_SIZE,
    STRICT,
    Bytes,
    Document,
    Flops,
    Label,
    Metadata,
    MicrobatchSize,
    Milliseconds,
    Name,
    Precision,
    Text,
    Tflops,
)


class Layer(BaseModel):
    """One layer's measurements at the profile's micro-batch size."""

    model_config = STRICT

    name: Name = Field(min_length=1, description="Unique name of the layer.")
    kind: Label = Field("layer", description="Layer type, e.g. Linear, Conv2d, Attention.")
    fwd_ms: Milliseconds = Field(description="Forward time of one micro-batch.")
    bwd_ms: Milliseconds = Field(description="Backward time of one micro-batch.")
    param_bytes: Bytes = Field(0, description="Bytes of parameters.")
    saved_bytes: Bytes = Field(0, description="Bytes kept from the forward for the backward.")
    output_bytes: Bytes = Field(0, description="Bytes of the output sent to the next layer.")
    workspace_bytes: Bytes = Field(0, description="Transient bytes while the layer runs.")
    update_ms: Milliseconds = Field(0.0, description="Optimizer update time of the parameters.")
    fwd_flops: Flops = Field(
        0,
        description="Floating-point operations of the forward of one micro-batch (0: not counted).",
    )
    bwd_flops: Flops = Field(
        0,
        description="Floating-point operations of the backward of one "
        "micro-batch (0: not counted).",
    )
    description: Text = Field("", description="Free text, e.g. the module's repr.")
    bwd_weight_ms: Milliseconds | None = Field(
        None,
        description="The backward's weight-gradient half alone, as zero-bubble defers it "
        "(after the input half); null: not measured, taken as half of bwd_ms for a layer "
        "with parameters (a matmul's two gradients cost the same) and none for one without.",
    )
    bwd_input_ms: Milliseconds | None = Field(
        None,
        description="The backward's input-gradient half alone (the gradients of the inputs "
        "and of the outputs of the modules with parameters); null: bwd_ms less the weight "
        "half. Split, the two halves may take longer than bwd_ms together.",
    )

    def backward_times(self, factor: float) -> dict[str, float | None]:
        """``bwd_ms`` and its measured halves, all ``factor`` times as long (for
        ``model_copy(update=...)``)."""
        return {
            field: None if value is None else value * factor
            for field, value in (
                ("bwd_ms", self.bwd_ms),
                ("bwd_weight_ms", self.bwd_weight_ms),
                ("bwd_input_ms", self.bwd_input_ms),
            )
        }

    @property
    def weight_grad_ms(self) -> float:
        """The weight-gradient half of the backward (measured, or estimated: above)."""
        if self.bwd_weight_ms is not None:
            return self.bwd_weight_ms
        return self.bwd_ms / 2 if self.param_bytes else 0.0

    @property
    def input_grad_ms(self) -> float:
        """The input-gradient half of the backward (measured, or the rest of bwd_ms)."""
        if self.bwd_input_ms is not None:
            return self.bwd_input_ms
        return max(self.bwd_ms - self.weight_grad_ms, 0.0)


class Edge(BaseModel):
    """Data flows from layer ``src`` into layer ``dst``."""

    model_config = STRICT

    src: Name
    dst: Name


@dataclass(frozen=True)
class LayerGraph:
    """Index form of a profile's data flow: predecessors and successors by layer index."""

    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]


class Profile(Document):
    """Per-layer measurements of one model (see the module docstring)."""

    format: Literal["pipestudio.profile"] = "pipestudio.profile"
    version: Literal[1] = 1
    model: Name = Field(min_length=1, description="Name of the profiled model.")
    microbatch_size: MicrobatchSize = Field(
        description="Micro-batch size the layers were measured at."
    )
    dtype: Label = Field("float32", description="Data type of parameters and activations.")
    precision: Precision = Field(
        "fp32",
        description="Arithmetic the layers were measured in: fp32, tf32 (TF32 "
        "matmuls), bf16 or fp16 (autocast over fp32 weights). Plans keep it.",
    )
    device: Label = Field("unknown", description="Device the profile was measured on.")
    peak_tflops: Tflops | None = Field(
        None,
        description="The device's peak TFLOP/s in the profile's precision as measured "
        "when it was profiled (a CPU: the best of a few large matmuls on the profile's "
        "threads); null: the table of known devices gives it (planner/simulator/peaks.py).",
    )
    input_bytes: Bytes = Field(0, description="Bytes of one micro-batch of input data.")
    op_overhead_ms: Milliseconds = Field(
        0.0,
        description="What the training engine spends between two compute ops on the "
        "machine profiled (posting transfers, sampling data, its own Python), whatever the "
        "op holds: each forward, backward and weight-gradient op takes this much longer. "
        "Calibration from a run measures it; 0: none. It does not scale with the "
        "micro-batch.",
    )
    layers: list[Layer] = Field(min_length=1, max_length=MAX_LAYERS)
    edges: list[Edge] | None = Field(
        None,
        max_length=MAX_EDGES,
        description="Data-flow edges for non-sequential models; null means a chain.",
    )
    metadata: Metadata = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_graph(self) -> "Profile":
        index: dict[str, int] = {}
        for idx, layer in enumerate(self.layers):
            if layer.name in index:
                raise ValueError(
                    f"duplicate layer name {layer.name!r} (layers {index[layer.name]} and {idx})"
                )
            index[layer.name] = idx
        for edge_idx, edge in enumerate(self.edges or []):
            for end in (edge.src, edge.dst):
                if end not in index:
                    raise ValueError(
                        f"edge {edge_idx} ({edge.src} -> {edge.dst}) names unknown layer {end!r}"
                    )
            if edge.src == edge.dst:
                raise ValueError(f"edge {edge_idx} is a self-loop on {edge.src!r}")
        if self.edges:
            cycle = find_cycle(len(self.layers), [(index[e.src], index[e.dst]) for e in self.edges])
            if cycle:
                names = " -> ".join(self.layers[i].name for i in cycle)
                raise ValueError(f"the edges contain a cycle: {names}")
            for edge in self.edges:
                if index[edge.src] > index[edge.dst]:
                    raise ValueError(
                        f"layers are not in topological order: {edge.dst!r} (layer "
                        f"{index[edge.dst]}) is listed before its input {edge.src!r} "
                        f"(layer {index[edge.src]})"
                    )
        return self

    @cached_property
    def layer_index(self) -> dict[str, int]:
        return {layer.name: idx for idx, layer in enumerate(self.layers)}

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def is_chain(self) -> bool:
        return self.edges is None

    @cached_property
    def graph(self) -> LayerGraph:
        n = len(self.layers)
        if self.edges is None:
            pairs = [(i, i + 1) for i in range(n - 1)]
        else:
            pairs = sorted({(self.layer_index[e.src], self.layer_index[e.dst]) for e in self.edges})
        preds: list[list[int]] = [[] for _ in range(n)]
        succs: list[list[int]] = [[] for _ in range(n)]
        for src, dst in pairs:
            preds[dst].append(src)
            succs[src].append(dst)
        return LayerGraph(tuple(map(tuple, preds)), tuple(map(tuple, succs)))

    def rescaled(self, microbatch_size: int) -> "Profile":
        """The same model at another micro-batch size: times, FLOPs and activations scale
        linearly in the batch, parameters stay constant."""
        if not 1 <= microbatch_size <= MAX_MICROBATCH_SIZE:
            raise ProfileError(
                f"micro-batch size must be between 1 and {MAX_MICROBATCH_SIZE}, "
                f"got {microbatch_size}"
            )
        if microbatch_size == self.microbatch_size:
            return self
        factor = microbatch_size / self.microbatch_size
        layers = [
            layer.model_copy(
                update={
                    "fwd_ms": layer.fwd_ms * factor,
                    **layer.backward_times(factor),
                    "fwd_flops": round(layer.fwd_flops * factor),
                    "bwd_flops": round(layer.bwd_flops * factor),
                    "saved_bytes": round(layer.saved_bytes * factor),
                    "output_bytes": round(layer.output_bytes * factor),
                    "workspace_bytes": round(layer.workspace_bytes * factor),
                }
            )
            for layer in self.layers
        ]
        return self.model_copy(
            update={
                "microbatch_size": microbatch_size,
                "input_bytes": round(self.input_bytes * factor),
                "layers": layers,
            }
        )


def find_cycle(num_nodes: int, pairs: list[tuple[int, int]]) -> list[int]:
    """A cycle of the directed graph as a closed node list (first == last), or []."""
    succs: list[list[int]] = [[] for _ in range(num_nodes)]
    for src, dst in pairs:
        succs[src].append(dst)
    color = [0] * num_nodes  # 0 unseen, 1 on the current path, 2 done
    parent = [-1] * num_nodes
    for root in range(num_nodes):
        if color[root]:
            continue
        stack = [(root, iter(succs[root]))]
        color[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                color[node] = 2
                stack.pop()
            elif color[child] == 1:
                cycle = [child]
                while node != child:
                    cycle.append(node)
                    node = parent[node]
                cycle.append(child)
                return cycle[::-1]
            elif color[child] == 0:
                color[child] = 1
                parent[child] = node
                stack.append((child, iter(succs[child])))
    return []
