"""``resnet``: a residual CNN with BatchNorm (He et al. 2016, basic blocks), one block a layer.

Layers: ``stem`` (3x3 convolution, BatchNorm, ReLU), ``block{i}`` (two 3x3 convolutions with
BatchNorm and an identity or 1x1 projection shortcut), ``head`` (global average pooling and a
linear classifier). Every ``downsample_every`` blocks the resolution halves and the channels
double, as between ResNet's stages. Keeping a whole residual block in one layer keeps its
shortcut inside the layer, so the model stays a chain.
"""

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models.spec import ModelSpec, sample_generator, seeded


class BasicBlock(nn.Module):
    """relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)); the shortcut projects when shapes change."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def resnet(
    *,
    blocks: int = 4,
    width: int = 16,
    image_size: int = 32,
    in_channels: int = 3,
    classes: int = 10,
    downsample_every: int = 2,
    seed: int = 0,
) -> ModelSpec:
    """A ResNet of ``blocks`` basic blocks starting at ``width`` channels."""
    for arg, value in (
        ("blocks", blocks),
        ("width", width),
        ("image_size", image_size),
        ("in_channels", in_channels),
        ("classes", classes),
        ("downsample_every", downsample_every),
    ):
        if value < 1:
            raise ModelError(f"resnet: {arg} must be >= 1, got {value}")
    with seeded(seed):
        layers: list[tuple[str, nn.Module]] = [
            (
                "stem",
                nn.Sequential(
                    nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
                    nn.BatchNorm2d(width),
                    nn.ReLU(),
                ),
            )
        ]
        channels = width
        for idx in range(blocks):
            stride = 2 if idx > 0 and idx % downsample_every == 0 else 1
            layers.append((f"block{idx}", BasicBlock(channels, channels * stride, stride)))
            channels *= stride
        layers.append(
            (
                "head",
                nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)),
            )
        )

    def sample(microbatch_size: int, index: int) -> tuple[Tensor, Tensor]:
        generator = sample_generator(seed, index)
        images = torch.randn(
            microbatch_size, in_channels, image_size, image_size, generator=generator
        )
        return images, torch.randint(0, classes, (microbatch_size,), generator=generator)

    return ModelSpec(
        name="resnet",
        layers=layers,
        sample=sample,
        loss=F.cross_entropy,
        config={
            "blocks": blocks,
            "width": width,
            "image_size": image_size,
            "in_channels": in_channels,
            "classes": classes,
            "downsample_every": downsample_every,
            "seed": seed,
        },
    )
