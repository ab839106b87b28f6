"""``unet``: a U-Net (Ronneberger et al. 2015) whose long skip connections make it a DAG.

Layers, for ``depth`` D: ``enc0`` .. ``enc{D-1}`` (each halves the resolution before its
convolutions, except ``enc0``), ``bottom`` (halves once more), ``dec{D-1}`` .. ``dec0`` and
``head`` (a 1x1 convolution to per-pixel class logits). Decoder ``dec{i}`` takes
``[the previous decoder output (or bottom), enc{i}]``: it upsamples the first, concatenates
the skip and convolves. Those long skips are why a pipeline stage holding ``dec{i}`` needs
``enc{i}``'s output from a much earlier stage, and why the spec lists ``inputs``.
"""

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models.spec import DATA, ModelSpec, sample_generator, seeded


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    """Two 3x3 convolutions, each with BatchNorm and ReLU, keeping the resolution."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
        nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


class Down(nn.Module):
    """An encoder level: optional 2x2 max pooling, then a conv block."""

    def __init__(self, in_channels: int, out_channels: int, pool: bool):
        super().__init__()
        self.pool: nn.Module = nn.MaxPool2d(2) if pool else nn.Identity()
        self.conv = conv_block(in_channels, out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(self.pool(x))


class Up(nn.Module):
    """A decoder level: upsample ``x`` 2x, concatenate the encoder's ``skip``, conv block."""

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, 2, stride=2)
        self.conv = conv_block(out_channels + skip_channels, out_channels)

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        return self.conv(torch.cat([self.up(x), skip], dim=1))


def unet(
    *,
    depth: int = 2,
    width: int = 8,
    image_size: int = 32,
    in_channels: int = 3,
    classes: int = 4,
    seed: int = 0,
) -> ModelSpec:
    """A U-Net with ``depth`` levels; level i has ``width * 2**i`` channels."""
    for arg, value in (
        ("depth", depth),
        ("width", width),
        ("image_size", image_size),
        ("in_channels", in_channels),
        ("classes", classes),
    ):
        if value < 1:
            raise ModelError(f"unet: {arg} must be >= 1, got {value}")
    if image_size % 2**depth:
        raise ModelError(
            f"unet: image_size {image_size} must be divisible by 2**depth = {2**depth}"
        )
    channels = [width * 2**level for level in range(depth + 1)]
    with seeded(seed):
        layers: list[tuple[str, nn.Module]] = [
            (
                f"enc{level}",
                Down(
                    in_channels if level == 0 else channels[level - 1],
                    channels[level],
                    pool=level > 0,
                ),
            )
            for level in range(depth)
        ]
        layers.append(("bottom", Down(channels[depth - 1], channels[depth], pool=True)))
        layers += [
            (f"dec{level}", Up(channels[level + 1], channels[level], channels[level]))
            for level in reversed(range(depth))
        ]
        layers.append(("head", nn.Conv2d(channels[0], classes, 1)))
    inputs = {"enc0": [DATA], "bottom": [f"enc{depth - 1}"], "head": ["dec0"]}
    inputs |= {f"enc{level}": [f"enc{level - 1}"] for level in range(1, depth)}
    inputs |= {
        f"dec{level}": [f"dec{level + 1}" if level < depth - 1 else "bottom", f"enc{level}"]
        for level in range(depth)
    }

    def sample(microbatch_size: int, index: int) -> tuple[Tensor, Tensor]:
        generator = sample_generator(seed, index)
        images = torch.randn(
            microbatch_size, in_channels, image_size, image_size, generator=generator
        )
        masks = torch.randint(
            0, classes, (microbatch_size, image_size, image_size), generator=generator
        )
        return images, masks

    return ModelSpec(
        name="unet",
        layers=layers,
        sample=sample,
        loss=F.cross_entropy,
        inputs=inputs,
        config={
            "depth": depth,
            "width": width,
            "image_size": image_size,
            "in_channels": in_channels,
            "classes": classes,
            "seed": seed,
        },
    )
