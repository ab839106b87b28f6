"""Operator-level profiles (``--granularity op``): valid profiles that every planner takes."""

import json
from pathlib import Path

import pytest

from pipestudio.cli import main
from pipestudio.planner import Plan, Profile, load_document, parse_document
from pipestudio.runtime.errors import SettingsError
from pipestudio.runtime.fx_ops import op_spec
from pipestudio.runtime.profiler import profile_model
from tests.runtime.helpers import TINY, tiny


def _profiles(name: str) -> tuple[Profile, Profile]:
    spec = tiny(name)
    settings = {"warmup": 1, "repeats": 3, "threads": 1}
    return (
        profile_model(spec, 2, **settings),
        profile_model(spec, 2, granularity="op", **settings),
    )


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_op_profile_is_a_valid_profile_of_the_operators(name: str) -> None:
    layers, ops = _profiles(name)
    again = parse_document(Profile, json.loads(ops.model_dump_json()))  # the schema's rules
    assert again == ops
    assert ops.model == layers.model == name and ops.metadata["granularity"] == "op"
    assert [op.name for op in ops.layers] == op_spec(tiny(name), 2).layer_names
    # every operator belongs to a layer, in order, and its edges are the operator graph's
    owner = [op.name.split(".", 1)[0] for op in ops.layers]
    assert owner == sorted(owner, key=[layer.name for layer in layers.layers].index)
    expected = op_spec(tiny(name), 2).edges()
    got = None if ops.edges is None else [(e.src, e.dst) for e in ops.edges]
    assert got == expected
    # parameters are split, not duplicated; a layer's output is its last operator's
    for layer in layers.layers:
        mine = [op for op in ops.layers if op.name.split(".", 1)[0] == layer.name]
        assert sum(op.param_bytes for op in mine) == layer.param_bytes
        assert mine[-1].output_bytes == layer.output_bytes
    # each activation is counted once, by the operator that made its storage: the same
    # total as the layers', plus layer outputs that a next layer's first operator saves
    op_saved = sum(op.saved_bytes for op in ops.layers)
    layer_saved = sum(layer.saved_bytes for layer in layers.layers)
    assert (
        layer_saved <= op_saved <= layer_saved + sum(layer.output_bytes for layer in layers.layers)
    )
    # times: same order of magnitude only (each operator carries its own call overhead)
    total_ops = sum(op.fwd_ms + op.bwd_ms for op in ops.layers)
    total_layers = sum(layer.fwd_ms + layer.bwd_ms for layer in layers.layers)
    assert 0.1 < total_ops / total_layers < 10
    assert all(op.fwd_ms > 0 for op in ops.layers)


def test_mlp_operators_form_a_chain_and_gpt_operators_a_graph() -> None:
    assert _profiles("mlp")[1].edges is None
    gpt = _profiles("gpt")[1]
    assert gpt.edges is not None
    assert ("embed.add", "block0.add") in {(e.src, e.dst) for e in gpt.edges}
    op = {layer.name: layer for layer in gpt.layers}
    # GELU saves its input, the first Linear's output: charged to that Linear
    assert op["block0.mlp.0"].saved_bytes == op["block0.mlp.0"].output_bytes
    # q, k and v are views of qkv's output, which attention saves: qkv is charged, once
    assert op["block0.attn.qkv"].saved_bytes == op["block0.attn.qkv"].output_bytes
    assert op["block0.attn.getitem"].saved_bytes == 0


def test_an_unknown_granularity_is_refused() -> None:
    with pytest.raises(SettingsError, match="granularity 'ops' is unknown"):
        profile_model(tiny("mlp"), 2, granularity="ops")


@pytest.mark.parametrize("algorithm", ["balance-time", "optimal", "dawnpiper", "vpipe"])
def test_planners_cut_the_op_profile_inside_a_layer(
    algorithm: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile_path, plan_path = tmp_path / "gpt-ops.json", tmp_path / "plan.json"
    args = [arg for key, value in TINY["gpt"].items() for arg in ("--model-arg", f"{key}={value}")]
    assert (
        main(
            [
                "profile",
                "--model",
                "gpt",
                *args,
                "--microbatch-size",
                "2",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--threads",
                "1",
                "--granularity",
                "op",
                "-o",
                str(profile_path),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "plan",
                str(profile_path),
                "--algorithm",
                algorithm,
                "--stages",
                "3",
                "--microbatches",
                "4",
                "--schedule",
                "1f1b",
                "--straight",
                "-o",
                str(plan_path),
            ]
        )
        == 0
    )
    capsys.readouterr()
    plan = load_document(Plan, str(plan_path))
    profile = load_document(Profile, str(profile_path))
    assert sorted(n for stage in plan.stages for n in stage.layers) == sorted(
        layer.name for layer in profile.layers
    )
    assert all("." in name for stage in plan.stages for name in stage.layers)
