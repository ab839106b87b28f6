"""Tiny configurations of the built-in models, small enough for a 2-core CPU."""

from torch import Tensor

from pipestudio.runtime.models import DATA, MODELS, ModelSpec

TINY: dict[str, dict[str, int | str]] = {
    "mlp": {"layers": 2, "width": 32, "in_features": 16, "out_features": 5},
    "gpt": {"layers": 2, "width": 32, "heads": 2, "seq_len": 16, "vocab": 64},
    "resnet": {"blocks": 3, "width": 4, "image_size": 8, "downsample_every": 2},
    "unet": {"depth": 2, "width": 4, "image_size": 8},
    "dynamic": {"layers": 3, "width": 32, "heads": 2, "seq_len": 16, "vocab": 64},
}
assert set(TINY) == set(MODELS)


def tiny(name: str, seed: int = 0) -> ModelSpec:
    return MODELS[name](**TINY[name], seed=seed)


def layer_outputs(spec: ModelSpec, data: Tensor) -> dict[str, Tensor]:
    """Every layer's output of one forward through the graph, for exact size checks."""
    outputs = {DATA: data}
    inputs = spec.graph_inputs()
    for name, module in spec.layers:
        outputs[name] = module(*(outputs[src] for src in inputs[name]))
    return outputs
