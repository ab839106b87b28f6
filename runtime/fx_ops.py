"""Operator-level models: a ``ModelSpec`` whose layers are the tensor operators of its layers.

DawnPiper (Peng et al. 2025, §3) partitions the fine-grained graph of a model, so a stage
boundary may fall inside what the model calls one layer. ``op_spec`` gives that graph as an
ordinary ``ModelSpec``: each layer is traced with ``torch.fx`` and every node that computes
a tensor from the layer's inputs becomes one layer of the new spec, a small
``GraphModule`` holding that node. Its name keeps the layer it came from and the module
it ran in (``block0.attn.qkv``, ``block0.attn.scaled_dot_product_attention``,
``block0.add_1``), and ``inputs`` records which operators it reads, so the profiler measures
every operator and the engine runs a plan cut between any two of them: a tensor that
crosses the cut travels as a boundary (skip) tensor like any layer output.

What a node becomes:

- a tensor computed from the layer's inputs (a module call, a function, a method): an
  operator layer;
- anything else (a shape, an int, the tuple ``chunk`` returns, a parameter read by
  ``get_attr``, a constant tensor): copied into every operator that reads it, since it is
  free to recompute and is not a tensor a stage could send. A parameter may be read by one
  operator only, else two stages would train two copies of it;
- an in-place operation, or an output that is not one tensor: an error naming the layer.

The operator layers share the spec's modules and parameters (no copies), so a parameter of
operator ``block0.attn.qkv`` is the same tensor as ``block0``'s ``attn.qkv.weight``. Which
nodes are tensors is found by running the layers once on the ``meta`` device (no memory,
no compute, no change to BatchNorm statistics).
"""

import copy
from collections.abc import Sequence
from typing import Any, Literal, get_args

import torch
from torch import Tensor, fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models.spec import DATA, ModelSpec

#: Keys of ``GraphModule.meta`` (kept by deepcopy) describing an operator layer.
KIND, SOURCE_LAYER, DESCRIPTION = "pipestudio.kind", "pipestudio.layer", "pipestudio.description"
#: What a layer is, in a profile and in the engine: a module, or one of its tensor operators.
Granularity = Literal["layer", "op"]
GRANULARITIES: tuple[Granularity, ...] = get_args(Granularity)

_CALLS = ("call_module", "call_function", "call_method")
_IN_PLACE_OPERATORS = {
    "setitem",
    "iadd",
    "isub",
    "imul",
    "itruediv",
    "ifloordiv",
    "ipow",
    "imod",
    "iand",
    "ior",
    "ixor",
    "ilshift",
    "irshift",
    "imatmul",
}


class _LeafTracer(fx.Tracer):
    """torch.fx's tracer, with every BatchNorm (also ``DeferredBatchNorm``) kept whole."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _BatchNorm) or super().is_leaf_module(m, module_qualified_name)


def op_spec(spec: ModelSpec, microbatch_size: int = 1) -> ModelSpec:
    """``spec`` with one layer per tensor operator (see the module docstring).

    ``microbatch_size`` is the batch size of the ``meta`` run that tells tensors apart.
    """
    if hasattr(spec, "apply_step"):
        raise ModelError(
            f"model {spec.name!r} switches its layers on and off during "
            "training (apply_step), which a torch.fx trace would freeze; "
            "profile and train it at layer granularity"
        )
    data, _ = spec.sample(microbatch_size, 0)
    graph_inputs = spec.graph_inputs()
    produced: dict[str, str] = {DATA: DATA}  # spec layer -> the operator layer making it
    meta_outputs: dict[str, Tensor] = {DATA: data.to("meta")}
    layers: list[tuple[str, nn.Module]] = []
    inputs: dict[str, list[str]] = {}
    for layer_name, module in spec.layers:
        sources = graph_inputs[layer_name]
        traced = trace_layer(layer_name, module, len(sources))
        tensors, meta_outputs[layer_name] = _tensor_nodes(
            layer_name, traced, [meta_outputs[src] for src in sources]
        )
        split = _LayerSplit(layer_name, traced, tensors, [produced[src] for src in sources])
        layers += split.pieces
        inputs.update(split.inputs)
        produced[layer_name] = split.output
    _check_parameters_owned_once(spec.name, layers)
    if not layers:
        raise ModelError(f"model {spec.name!r} has no tensor operator to run")
    if produced[spec.layer_names[-1]] != layers[-1][0]:
        raise ModelError(
            f"model {spec.name!r}: the last layer {spec.layer_names[-1]!r} "
            "computes no operator of its own"
        )
    names = [name for name, _ in layers]
    chain = all(inputs[name] == [names[idx - 1] if idx else DATA] for idx, name in enumerate(names))
    return ModelSpec(
        name=spec.name,
        layers=layers,
        sample=spec.sample,
        loss=spec.loss,
        inputs=None if chain else inputs,
        config=dict(spec.config),
    )


def trace_layer(layer_name: str, module: nn.Module, num_inputs: int) -> fx.GraphModule:
    """``module`` traced by torch.fx; a ``ModelError`` naming the layer when it cannot be."""
    try:
        graph = _LeafTracer().trace(module)
    except Exception as exc:
        raise ModelError(
            f"layer {layer_name!r} ({type(module).__name__}) cannot be traced by "
            f"torch.fx: {type(exc).__name__}: {str(exc).splitlines()[0]}; keep "
            "the layer granularity, or write its forward without control flow "
            "on tensor values and without iterating tensors"
        ) from exc
    traced = fx.GraphModule(module, graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if any(len(n.args) == 0 for n in placeholders[num_inputs:]) or len(placeholders) < num_inputs:
        raise ModelError(
            f"layer {layer_name!r} is given {num_inputs} input(s) but its forward "
            f"takes {len(placeholders)}: {[n.target for n in placeholders]}"
        )
    for node in graph.nodes:
        if _in_place(traced, node):
            raise ModelError(
                f"layer {layer_name!r}: operator {node.name!r} ({node.target}) "
                "works in place, which cannot be split into operators; write it "
                "out of place"
            )
    return traced


def _in_place(traced: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return bool(getattr(traced.get_submodule(str(node.target)), "inplace", False))
    if node.op not in ("call_method", "call_function"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return (
        node.kwargs.get("inplace") is True
        or name in _IN_PLACE_OPERATORS
        or (name.endswith("_") and not name.endswith("__"))
    )


def _tensor_nodes(
    layer_name: str, traced: fx.GraphModule, meta_inputs: Sequence[Tensor]
) -> tuple[set[str], Tensor]:
    """Names of the nodes whose value is a tensor, and the layer's output, on ``meta``."""
    tensors: set[str] = set()

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            value = super().run_node(n)
            if isinstance(value, Tensor):
                tensors.add(n.name)
            return value

    meta_module = copy.deepcopy(traced).to("meta")
    try:
        with torch.no_grad():
            output = Recorder(meta_module).run(*meta_inputs)
    except Exception as exc:
        raise ModelError(
            f"layer {layer_name!r} cannot run on the meta device to find its "
            f"operators: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from exc
    if not isinstance(output, Tensor):
        raise ModelError(f"layer {layer_name!r} returns a {type(output).__name__}, not one tensor")
    return tensors, output


class _LayerSplit:
    """One traced layer cut into operator layers, wired to what the layer reads."""

    def __init__(
        self, layer_name: str, traced: fx.GraphModule, tensors: set[str], sources: Sequence[str]
    ) -> None:
        self.layer_name, self.traced = layer_name, traced
        nodes = list(traced.graph.nodes)
        self.position = {node: idx for idx, node in enumerate(nodes)}
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self.external: dict[fx.Node, str] = dict(zip(placeholders, sources, strict=False))
        self.constants = {n: n.args[0] for n in placeholders[len(sources) :]}
        output = next(n for n in nodes if n.op == "output").args[0]
        live = _ancestors(output) if isinstance(output, fx.Node) else set()
        reads_input = _reads_inputs(nodes, set(self.external))
        self.ops = [
            n
            for n in nodes
            if n.op in _CALLS and n in live and n.name in tensors and n in reads_input
        ]
        self.names = _op_names(layer_name, traced, self.ops)
        self.pieces: list[tuple[str, nn.Module]] = []
        self.inputs: dict[str, list[str]] = {}
        for node in self.ops:
            self.external[node] = self.names[node]
            self._add_piece(node)
        if not isinstance(output, fx.Node) or output not in self.external:
            raise ModelError(
                f"layer {layer_name!r} does not return one tensor computed from "
                f"its inputs (it returns {output!r})"
            )
        self.output = self.external[output]

    def _add_piece(self, node: fx.Node) -> None:
        reads: list[fx.Node] = []
        copied: set[fx.Node] = set()
        stack = list(node.all_input_nodes)
        while stack:
            dep = stack.pop()
            if dep in self.external:
                if dep not in reads:
                    reads.append(dep)
            elif dep not in self.constants and dep not in copied:
                copied.add(dep)
                stack.extend(dep.all_input_nodes)
        reads.sort(key=self.position.__getitem__)
        graph = fx.Graph()
        env: dict[fx.Node, Any] = dict(self.constants)
        for dep in reads:
            env[dep] = graph.placeholder(dep.name)
        for dep in self.traced.graph.nodes:
            if dep in copied:
                env[dep] = graph.node_copy(dep, lambda n: env[n])
        env[node] = graph.node_copy(node, lambda n: env[n])
        graph.output(env[node])
        piece = fx.GraphModule(self.traced, graph)
        piece.meta.update(
            {
                KIND: _kind(self.traced, node),
                SOURCE_LAYER: self.layer_name,
                DESCRIPTION: _describe(self.layer_name, self.traced, node),
            }
        )
        self.pieces.append((self.names[node], piece))
        self.inputs[self.names[node]] = [self.external[dep] for dep in reads]


def _ancestors(output: fx.Node) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [output]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _reads_inputs(nodes: list[fx.Node], inputs: set[fx.Node]) -> set[fx.Node]:
    """The nodes that depend on a layer input (the others are constants)."""
    reading = set(inputs)
    for node in nodes:
        if any(dep in reading for dep in node.all_input_nodes):
            reading.add(node)
    return reading


def _op_names(layer_name: str, traced: fx.GraphModule, ops: list[fx.Node]) -> dict[fx.Node, str]:
    """``layer.module_path`` for a module call, ``layer.scope.function`` otherwise, with
    ``_1``, ``_2``... for repeats."""
    names: dict[fx.Node, str] = {}
    used: dict[str, int] = {}
    for node in ops:
        if node.op == "call_module":
            base = f"{layer_name}.{node.target}"
        else:
            stack = node.meta.get("nn_module_stack") or {}
            scope = list(stack.values())[-1][0] if stack else ""
            func = (
                node.target
                if isinstance(node.target, str)
                else getattr(node.target, "__name__", str(node.target))
            )
            base = ".".join(part for part in (layer_name, scope, func) if part)
        count = used.get(base, 0)
        used[base] = count + 1
        names[node] = base if count == 0 else f"{base}_{count}"
    return names


def _kind(traced: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(traced.get_submodule(str(node.target))).__name__
    if isinstance(node.target, str):
        return node.target
    return getattr(node.target, "__name__", str(node.target))


def _describe(layer_name: str, traced: fx.GraphModule, node: fx.Node) -> str:
    """``block0: attn_qkv = Linear(ln1)``, cut to 120 characters."""
    args = ", ".join(
        [str(arg) for arg in node.args] + [f"{key}={value}" for key, value in node.kwargs.items()]
    )
    text = f"{layer_name}: {node.name} = {_kind(traced, node)}({args})"
    return text if len(text) <= 120 else text[:117] + "..."


def _check_parameters_owned_once(model: str, layers: list[tuple[str, nn.Module]]) -> None:
    owner: dict[int, str] = {}
    for name, piece in layers:
        for key, param in piece.named_parameters():
            if id(param) in owner:
                raise ModelError(
                    f"model {model!r}: parameter {key!r} is read by operators "
                    f"{owner[id(param)]!r} and {name!r}; at operator "
                    "granularity a parameter must belong to one operator"
                )
            owner[id(param)] = name


def op_kind(module: nn.Module) -> str | None:
    """The operator an operator layer runs (``Linear``, ``add``...); None for other modules."""
    meta = getattr(module, "meta", None)
    return meta.get(KIND) if isinstance(meta, dict) else None


def op_description(module: nn.Module) -> str | None:
    meta = getattr(module, "meta", None)
    return meta.get(DESCRIPTION) if isinstance(meta, dict) else None


def source_layer(module: nn.Module) -> str | None:
    """The layer of the original spec an operator layer was cut from."""
    meta = getattr(module, "meta", None)
    return meta.get(SOURCE_LAYER) if isinstance(meta, dict) else None
