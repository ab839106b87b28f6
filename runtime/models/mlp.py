"""``mlp``: a chain of Linear+GELU blocks and a linear classifier, the smallest test model.

Its labels come from a fixed random "teacher" projection of the inputs, so unlike pure noise
they can be learned: a training run's loss visibly falls.
"""

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models.spec import ModelSpec, sample_generator, seeded


def mlp(
    *,
    layers: int = 4,
    width: int = 256,
    in_features: int = 64,
    out_features: int = 10,
    seed: int = 0,
) -> ModelSpec:
    """``layers`` hidden blocks ``block{i}`` (Linear then GELU) and a ``head`` Linear."""
    for arg, value in (
        ("layers", layers),
        ("width", width),
        ("in_features", in_features),
        ("out_features", out_features),
    ):
        if value < 1:
            raise ModelError(f"mlp: {arg} must be >= 1, got {value}")
    with seeded(seed):
        blocks: list[tuple[str, nn.Module]] = [
            (
                f"block{idx}",
                nn.Sequential(nn.Linear(in_features if idx == 0 else width, width), nn.GELU()),
            )
            for idx in range(layers)
        ]
        head = nn.Linear(width, out_features)
        teacher = torch.randn(in_features, out_features)

    def sample(microbatch_size: int, index: int) -> tuple[Tensor, Tensor]:
        inputs = torch.randn(microbatch_size, in_features, generator=sample_generator(seed, index))
        return inputs, (inputs @ teacher).argmax(dim=1)

    return ModelSpec(
        name="mlp",
        layers=[*blocks, ("head", head)],
        sample=sample,
        loss=F.cross_entropy,
        config={
            "layers": layers,
            "width": width,
            "in_features": in_features,
            "out_features": out_features,
            "seed": seed,
        },
    )
