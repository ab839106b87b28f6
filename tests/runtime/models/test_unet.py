"""The U-Net is the built-in model that is not a chain."""

import pytest
import torch

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models import DATA, unet


def test_decoders_read_the_matching_encoder() -> None:
    spec = unet(depth=3, width=4, image_size=16)
    assert not spec.is_chain
    assert spec.layer_names == ["enc0", "enc1", "enc2", "bottom", "dec2", "dec1", "dec0", "head"]
    assert spec.graph_inputs()["enc0"] == [DATA]
    assert spec.graph_inputs()["dec2"] == ["bottom", "enc2"]
    assert spec.graph_inputs()["dec0"] == ["dec1", "enc0"]
    edges = spec.edges()
    assert edges is not None
    assert {("enc0", "dec0"), ("enc1", "dec1"), ("enc2", "dec2")} <= set(edges)
    assert len(edges) == 7 + 3  # the spine and the long skips


def test_output_is_per_pixel_logits() -> None:
    spec = unet(depth=2, width=4, image_size=8, classes=3)
    images, masks = spec.sample(2, 0)
    logits = spec.as_module()(images)
    assert logits.shape == (2, 3, 8, 8) and masks.shape == (2, 8, 8)
    assert torch.isfinite(spec.loss(logits, masks))


def test_image_size_must_halve_depth_plus_one_times() -> None:
    with pytest.raises(ModelError, match="image_size 12 must be divisible by 2\\*\\*depth = 8"):
        unet(depth=3, image_size=12)
