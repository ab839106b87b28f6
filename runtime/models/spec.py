"""The model contract: ``ModelSpec``, what every model factory returns, and its reference run.

A model is a list of named layers in a topological order. Each layer is an ``nn.Module``
that returns one tensor. Without ``inputs`` the layers form a chain: the first takes the
micro-batch's data, every other one the previous layer's output. With ``inputs`` each layer
lists the layers it reads, in the order its ``forward`` takes them positionally; the name
``"input"`` stands for the data. A pipeline cuts this list into stages, and the profiler
measures it layer by layer, so the layer is the unit of partitioning: its boundaries are
where activations may cross devices.

Data is synthetic and reproducible: ``sample(microbatch_size, index)`` depends only on the
factory's seed and the micro-batch index, so every pipeline stage, a single-process
reference run and a resumed run all see the same micro-batch number ``index``.
"""

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from pipestudio.runtime.errors import ModelError

#: The name under which a layer reads the micro-batch's input data.
DATA = "input"

Sampler = Callable[[int, int], tuple[Tensor, Tensor]]
LossFn = Callable[[Tensor, Tensor], Tensor]
ConfigValue = int | float | str | bool


@dataclass
class ModelSpec:
    """A model cut into layers, with its data and loss (see the module docstring)."""

    name: str
    layers: list[tuple[str, nn.Module]]
    sample: Sampler
    loss: LossFn
    inputs: dict[str, list[str]] | None = None
    config: dict[str, ConfigValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ModelError(f"model {self.name!r} has no layers")
        seen: set[str] = set()
        for layer_name, module in self.layers:
            if not layer_name or layer_name == DATA or layer_name in seen:
                what = "is reserved for the data" if layer_name == DATA else "is empty or repeated"
                raise ModelError(f"model {self.name!r}: layer name {layer_name!r} {what}")
            if not isinstance(module, nn.Module):
                raise ModelError(
                    f"model {self.name!r}: layer {layer_name!r} is a "
                    f"{type(module).__name__}, not a torch.nn.Module"
                )
            seen.add(layer_name)
        if self.inputs is not None:
            self._check_inputs(self.inputs)

    def _check_inputs(self, inputs: dict[str, list[str]]) -> None:
        names = [layer_name for layer_name, _ in self.layers]
        if extra := sorted(set(inputs) - set(names)):
            raise ModelError(f"model {self.name!r}: inputs name unknown layers {extra}")
        earlier = {DATA}
        for layer_name in names:
            sources = inputs.get(layer_name)
            if not sources:
                raise ModelError(
                    f"model {self.name!r}: layer {layer_name!r} has no inputs; "
                    f"list its input layers (or {DATA!r} for the data)"
                )
            if late := [src for src in sources if src not in earlier]:
                raise ModelError(
                    f"model {self.name!r}: layer {layer_name!r} reads {late}, which "
                    f"are not layers listed before it (nor {DATA!r})"
                )
            earlier.add(layer_name)

    @property
    def layer_names(self) -> list[str]:
        return [layer_name for layer_name, _ in self.layers]

    @property
    def is_chain(self) -> bool:
        return self.inputs is None

    def graph_inputs(self) -> dict[str, list[str]]:
        """Every layer's inputs, the chain spelled out when ``inputs`` is None."""
        if self.inputs is not None:
            return {layer_name: list(self.inputs[layer_name]) for layer_name in self.layer_names}
        names = self.layer_names
        return {
            layer_name: [DATA if idx == 0 else names[idx - 1]]
            for idx, layer_name in enumerate(names)
        }

    def edges(self) -> list[tuple[str, str]] | None:
        """(src, dst) for every input that is a layer, in layer order; None for a chain."""
        if self.inputs is None:
            return None
        return [
            (src, dst)
            for dst, sources in self.graph_inputs().items()
            for src in sources
            if src != DATA
        ]

    def as_module(self) -> "SpecModule":
        """The whole model as one module, sharing this spec's layers (not copies)."""
        return SpecModule(self)


class SpecModule(nn.Module):
    """Runs a spec's layers in order in one process: the reference a pipeline must match.

    ``forward(data)`` returns the last layer's output; an activation is dropped as soon as
    its last reader has run, as the pipeline does between stages.
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.layer_names = spec.layer_names
        self.layers = nn.ModuleList(module for _, module in spec.layers)
        self.inputs = spec.graph_inputs()
        last_reader: dict[str, str] = {}
        for layer_name, sources in self.inputs.items():
            for src in sources:
                last_reader[src] = layer_name
        self._frees_after: dict[str, list[str]] = {}
        for src, reader in last_reader.items():
            self._frees_after.setdefault(reader, []).append(src)

    def forward(self, data: Tensor) -> Tensor:
        outputs: dict[str, Tensor] = {DATA: data}
        for layer_name, module in zip(self.layer_names, self.layers, strict=True):
            outputs[layer_name] = module(*(outputs[src] for src in self.inputs[layer_name]))
            for src in self._frees_after.get(layer_name, []):
                del outputs[src]
        return outputs[self.layer_names[-1]]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU generator inside the block and restore its state afterwards, so a
    factory initialises the same weights in every process without disturbing the caller."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def sample_generator(seed: int, index: int, *, stream: str = "data") -> torch.Generator:
    """A CPU generator determined by (stream, seed, index) alone.

    Hashing the three keeps nearby pairs like (1, 0) and (0, 1) apart, so the data of
    micro-batch ``index`` never depends on which micro-batches were drawn before it, and
    another use of randomness (``stream``) never replays the data's numbers.
    """
    digest = hashlib.blake2b(f"{stream}:{seed}:{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
