"""Resolving model names and KEY=VALUE arguments (models/loading.py, models/__init__.py)."""

from pathlib import Path

import pytest
import torch
from torch import nn

from pipestudio.runtime.errors import ModelError
from pipestudio.runtime.models import MODELS, ModelSpec, load_model, parse_model_args
from pipestudio.runtime.models.loading import convert_value


def custom_model(
    *, depth: int = 2, scale: float = 1.0, act: str = "relu", seed: int = 0
) -> ModelSpec:
    """A user factory as docs/runtime.md describes one."""
    layers: list[tuple[str, nn.Module]] = [(f"fc{idx}", nn.Linear(4, 4)) for idx in range(depth)]
    return ModelSpec(
        name="custom",
        layers=layers,
        sample=lambda n, i: (torch.full((n, 4), scale), torch.zeros(n, 4)),
        loss=nn.functional.mse_loss,
        config={"depth": depth, "scale": scale, "act": act, "seed": seed},
    )


def not_a_model() -> str:
    return "oops"


def test_args_are_parsed_and_converted() -> None:
    assert parse_model_args(["layers=8", "name = x", "flag=true"]) == {
        "layers": "8",
        "name": "x",
        "flag": "true",
    }
    assert [convert_value(text) for text in ("8", "-2", "0.5", "1e3", "True", "false", "gelu")] == [
        8,
        -2,
        0.5,
        1000.0,
        True,
        False,
        "gelu",
    ]


@pytest.mark.parametrize(
    "items,message",
    [
        (["layers"], "--model-arg 'layers' must look like KEY=VALUE"),
        (["=3"], "--model-arg '=3' must look like KEY=VALUE"),
        (["a=1", "a=2"], "--model-arg 'a' is given twice"),
    ],
)
def test_bad_args_are_named(items: list[str], message: str) -> None:
    with pytest.raises(ModelError, match=message):
        parse_model_args(items)


def test_builtin_by_name_with_string_args() -> None:
    spec = load_model("mlp", {"layers": "1", "width": "8", "in_features": "4"})
    assert spec.config["layers"] == 1 and spec.config["width"] == 8
    assert spec.layer_names == ["block0", "head"]


def test_user_factory_by_module_and_by_file(tmp_path: Path) -> None:
    spec = load_model(
        "tests.runtime.models.test_loading:custom_model",
        {"depth": "3", "scale": "2", "act": "gelu"},
    )
    assert spec.layer_names == ["fc0", "fc1", "fc2"]
    assert spec.config["scale"] == 2.0 and isinstance(spec.config["scale"], float)
    path = tmp_path / "my_models.py"
    path.write_text("from tests.runtime.models.test_loading import custom_model as build\n")
    assert load_model(f"{path}:build", {}).name == "custom"


@pytest.mark.parametrize(
    "name,args,message",
    [
        ("bert", {}, "unknown model 'bert'; expected one of " + ", ".join(MODELS)),
        (
            "gpt",
            {"depth": "3"},
            "model 'gpt' has no argument 'depth'; its arguments are heads, "
            "layers, mlp_ratio, seed, seq_len, vocab, width",
        ),
        ("gpt", {"width": "wide"}, "argument width='wide' must be int"),
        ("gpt", {"width": "96", "heads": "5"}, "width 96 is not divisible by heads 5"),
        ("no_such_module:f", {}, "cannot import 'no_such_module'"),
        ("tests.runtime.models.test_loading:nothing", {}, "has no callable 'nothing'"),
        ("tests.runtime.models.test_loading:not_a_model", {}, "returned a str, not a ModelSpec"),
        (":f", {}, "must look like MODULE:FACTORY"),
    ],
)
def test_bad_models_are_named(name: str, args: dict[str, str], message: str) -> None:
    with pytest.raises(ModelError, match=message):
        load_model(name, args)
