"""Cutting a model into its tensor operators with torch.fx (runtime/fx_ops.py)."""

import pytest
import torch
from torch import Tensor, nn

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.fx_ops import op_kind, op_spec, source_layer
from pipestudio.runtime.models import DATA, ModelSpec, sample_generator
from tests.runtime.helpers import tiny

TRACEABLE = ["gpt", "mlp", "resnet", "unet"]


@pytest.mark.parametrize("name", TRACEABLE)
def test_operators_compute_the_model(name: str) -> None:
    spec = tiny(name)
    ops = op_spec(spec, 2)
    data, _ = spec.sample(2, 1)
    model, cut = spec.as_module().eval(), ops.as_module().eval()
    torch.testing.assert_close(cut(data), model(data), rtol=0, atol=0)
    assert len(ops.layers) > len(spec.layers)
    # every parameter is one of the model's own, under its path in the layer it came from
    own = {
        f"{layer}.{key}": param
        for layer, module in spec.layers
        for key, param in module.named_parameters()
    }
    mine = {
        f"{source_layer(piece)}.{key}": param
        for _, piece in ops.layers
        for key, param in piece.named_parameters()
    }
    assert set(mine) == set(own)
    assert all(mine[key] is own[key] for key in own)


def test_gpt_operators_are_named_after_their_layer_and_module() -> None:
    ops = op_spec(tiny("gpt"), 2)
    names = ops.layer_names
    assert names[:4] == ["embed.arange", "embed.tokens", "embed.positions", "embed.add"]
    block = [name.removeprefix("block0.") for name in names if name.startswith("block0.")]
    assert block == [
        "ln1",
        "attn.qkv",
        "attn.getitem",
        "attn.getitem_1",
        "attn.getitem_2",
        "attn.unflatten",
        "attn.transpose",
        "attn.unflatten_1",
        "attn.transpose_1",
        "attn.unflatten_2",
        "attn.transpose_2",
        "attn.scaled_dot_product_attention",
        "attn.transpose_3",
        "attn.flatten",
        "attn.proj",
        "add",
        "ln2",
        "mlp.0",
        "mlp.1",
        "mlp.2",
        "add_1",
    ]
    inputs = ops.graph_inputs()
    assert inputs["block0.ln1"] == ["embed.add"]
    assert inputs["block0.add"] == ["embed.add", "block0.attn.proj"]  # the residual
    assert inputs["block0.attn.scaled_dot_product_attention"] == [
        "block0.attn.transpose",
        "block0.attn.transpose_1",
        "block0.attn.transpose_2",
    ]
    assert inputs["embed.arange"] == [DATA] and inputs["embed.tokens"] == [DATA]
    assert op_kind(dict(ops.layers)["block0.attn.qkv"]) == "Linear"
    assert op_kind(dict(ops.layers)["block0.add"]) == "add"


def test_a_chain_of_operators_stays_a_chain() -> None:
    ops = op_spec(tiny("mlp"), 2)
    assert ops.layer_names == ["block0.0", "block0.1", "block1.0", "block1.1", "head.linear"]
    assert ops.is_chain and ops.edges() is None
    unet = op_spec(tiny("unet"), 2)
    assert ("enc0.conv.5", "dec0.cat") in (unet.edges() or [])  # the long skip survives


def test_the_dynamic_model_is_refused() -> None:
    with pytest.raises(ModelError, match=r"dynamic.*apply_step"):
        op_spec(tiny("dynamic"), 2)


class Branchy(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * 2 if x.sum() > 0 else x


class InPlace(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        y = x * 2
        return y.add_(1)


class Pair(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x, x * 2


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4, 4))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight + x @ self.weight.t()


def _spec_of(module: nn.Module) -> ModelSpec:
    def sample(size: int, index: int) -> tuple[Tensor, Tensor]:
        x = torch.randn(size, 4, generator=sample_generator(0, index))
        return x, x

    return ModelSpec(
        name="toy",
        layers=[("first", nn.Linear(4, 4)), ("bad", module)],
        sample=sample,
        loss=nn.functional.mse_loss,
    )


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (Branchy(), r"layer 'bad' \(Branchy\) cannot be traced by torch.fx: TraceError"),
        (InPlace(), r"layer 'bad': operator 'add_' .* works in place"),
        (Pair(), r"layer 'bad' returns a tuple, not one tensor"),
        (Tied(), r"parameter 'weight' is read by operators 'bad.matmul' and 'bad.matmul_1'"),
    ],
)
def test_what_cannot_be_cut_is_named(module: nn.Module, reason: str) -> None:
    with pytest.raises(ModelError, match=reason):
        op_spec(_spec_of(module), 2)


def test_cutting_leaves_batchnorm_statistics_alone() -> None:
    spec = tiny("resnet")
    before = {
        key: value.clone()
        for _, module in spec.layers
        for key, value in module.state_dict().items()
    }
    op_spec(spec, 2)
    after = {key: value for _, module in spec.layers for key, value in module.state_dict().items()}
    assert all(torch.equal(before[key], after[key]) for key in before)
