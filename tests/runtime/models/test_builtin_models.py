"""Every built-in model honours the ModelSpec contract (models/spec.py)."""

import pytest
import torch

from pipestudio.runtime.models import MODELS, ModelSpec
from tests.runtime.helpers import TINY, tiny

pytestmark = pytest.mark.parametrize("name", sorted(MODELS))


def parameters(spec: ModelSpec) -> dict[str, torch.Tensor]:
    return {
        f"{layer}.{key}": value
        for layer, module in spec.layers
        for key, value in module.state_dict().items()
    }


def test_builds_with_defaults(name: str) -> None:
    spec = MODELS[name]()
    assert spec.name == name
    assert len(set(spec.layer_names)) == len(spec.layers) >= 3
    assert spec.config["seed"] == 0
    assert all(isinstance(value, (int, float, str, bool)) for value in spec.config.values())
    assert set(TINY[name]) <= set(spec.config)


def test_same_seed_same_weights(name: str) -> None:
    first, second, other = (
        parameters(tiny(name)),
        parameters(tiny(name)),
        parameters(tiny(name, seed=1)),
    )
    assert first.keys() == second.keys() == other.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert any(
        not torch.equal(first[key], other[key]) for key in first if first[key].is_floating_point()
    )


def test_building_leaves_the_global_generator_alone(name: str) -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    tiny(name, seed=7)
    assert torch.equal(torch.rand(4), expected)


def test_sample_depends_on_seed_and_index_only(name: str) -> None:
    spec = tiny(name)
    inputs, targets = spec.sample(3, 5)
    torch.rand(10)  # drawing elsewhere must not matter
    again_inputs, again_targets = tiny(name).sample(3, 5)
    assert torch.equal(inputs, again_inputs) and torch.equal(targets, again_targets)
    assert inputs.shape[0] == targets.shape[0] == 3
    next_inputs, _ = spec.sample(3, 6)
    assert not torch.equal(inputs, next_inputs)
    assert not torch.equal(inputs, tiny(name, seed=1).sample(3, 5)[0])


def test_reference_run_trains_every_parameter(name: str) -> None:
    spec = tiny(name)
    inputs, targets = spec.sample(2, 0)
    module = spec.as_module()
    loss = spec.loss(module(inputs), targets)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    missing = [
        key
        for key, p in module.named_parameters()
        if p.grad is None or not torch.isfinite(p.grad).all()
    ]
    assert not missing
    assert next(module.parameters()) is next(spec.layers[0][1].parameters())
