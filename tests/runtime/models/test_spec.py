"""The ModelSpec contract: validation, the graph and the reference module (models/spec.py)."""

import pytest
import torch
from torch import nn

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models import DATA, ModelSpec, SpecModule, sample_generator


class Add(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def make(layers: list[tuple[str, nn.Module]], inputs: dict[str, list[str]] | None) -> ModelSpec:
    return ModelSpec(
        name="toy",
        layers=layers,
        inputs=inputs,
        sample=lambda n, i: (torch.ones(n, 2), torch.zeros(n)),
        loss=lambda out, _: out.mean(),
    )


def test_chain_inputs_and_edges() -> None:
    spec = make([("a", nn.Linear(2, 2)), ("b", nn.ReLU())], None)
    assert spec.is_chain and spec.edges() is None
    assert spec.graph_inputs() == {"a": [DATA], "b": ["a"]}


def test_a_dag_runs_its_layers_with_inputs_in_the_listed_order() -> None:
    double, triple = nn.Linear(2, 2), nn.Linear(2, 2)
    spec = make(
        [("x2", double), ("x3", triple), ("sum", Add())],
        {"x2": [DATA], "x3": ["x2"], "sum": ["x3", "x2"]},
    )
    assert spec.edges() == [("x2", "x3"), ("x3", "sum"), ("x2", "sum")]
    data = torch.randn(4, 2)
    expected = triple(double(data)) + double(data)
    assert torch.allclose(SpecModule(spec)(data), expected)


@pytest.mark.parametrize(
    "layers,inputs,message",
    [
        ([], None, "has no layers"),
        ([("a", nn.ReLU()), ("a", nn.ReLU())], None, "layer name 'a' is empty or repeated"),
        ([("input", nn.ReLU())], None, "layer name 'input' is reserved for the data"),
        ([("a", lambda x: x)], None, "layer 'a' is a function, not a torch.nn.Module"),
        (
            [("a", nn.ReLU()), ("b", nn.ReLU())],
            {"a": ["b"], "b": ["input"]},
            "layer 'a' reads \\['b'\\], which are not layers listed before it",
        ),
        ([("a", nn.ReLU())], {"a": ["input"], "z": ["a"]}, "inputs name unknown layers \\['z'\\]"),
        ([("a", nn.ReLU()), ("b", nn.ReLU())], {"a": ["input"]}, "layer 'b' has no inputs"),
    ],
)
def test_bad_specs_are_named(
    layers: list[tuple[str, nn.Module]], inputs: dict[str, list[str]] | None, message: str
) -> None:
    with pytest.raises(ModelError, match=message):
        make(layers, inputs)


def test_sample_generators_differ_by_seed_index_and_stream() -> None:
    def draw(seed: int, index: int, stream: str = "data") -> torch.Tensor:
        return torch.rand(4, generator=sample_generator(seed, index, stream=stream))

    assert torch.equal(draw(1, 0), draw(1, 0))
    draws = [draw(1, 0), draw(0, 1), draw(1, 1), draw(1, 0, "other")]
    assert all(not torch.equal(a, b) for i, a in enumerate(draws) for b in draws[i + 1 :])
