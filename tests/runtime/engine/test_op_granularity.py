"""Plans cut between tensor operators (``granularity="op"``) train as the whole model does."""

import itertools
from pathlib import Path

import pytest

from pipestudio.runtime.engine import EngineConfig
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.launcher import check_config
from pipestudio.runtime.fx_ops import op_spec, source_layer
from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    model_args,
    run,
)
from tests.runtime.engine.reference import train_single

STEPS = 3


def _cut(names: list[str], *boundaries: str) -> list[list[str]]:
    """Stages of ``names`` starting at each of ``boundaries``."""
    starts = [0, *(names.index(name) for name in boundaries), len(names)]
    return [names[a:b] for a, b in itertools.pairwise(starts)]


@pytest.mark.parametrize(
    ("schedule", "boundaries", "policies"),
    [
        # inside block0's attention (q, k, v cross), and between its MLP's Linear and GELU
        ("gpipe", ("block0.attn.getitem_1", "block0.mlp.1"), {}),
        # after embed's token lookup (positions cross), inside block1; recompute inside a stage
        (
            "1f1b",
            ("embed.positions", "block1.attn.proj"),
            {
                "block0.attn.qkv": "recompute",
                "block0.attn.getitem": "recompute",
                "block0.mlp.0": "swap",
            },
        ),
    ],
)
def test_a_plan_cut_inside_gpt_blocks_equals_single_process(
    schedule: str, boundaries: tuple[str, ...], policies: dict[str, str], tmp_path: Path
) -> None:
    ops = op_spec(builder("gpt")(), 2)
    stages = _cut(ops.layer_names, *boundaries)
    plan = make_plan("gpt", stages, schedule, optimizer="momentum", policies=policies)
    result = run(plan, "gpt", STEPS, tmp_path, granularity="op")
    assert result.ok, result.message
    by_op = final_params(tmp_path, plan, ops.layer_names)
    rename = {
        f"{name}.{key}": f"{source_layer(piece)}.{key}"
        for name, piece in ops.layers
        for key, _ in piece.named_parameters()
    }
    got = {rename[key]: value for key, value in by_op.items()}
    expected = train_single(builder("gpt"), plan, STEPS)  # the layer-level model, one process
    assert max_relative_difference(got, expected) <= 1e-5
    initial = {
        f"{n}.{k}": v.detach() for n, m in builder("gpt")().layers for k, v in m.named_parameters()
    }
    assert max_relative_difference(got, initial) > 1e-4  # it did train


def test_an_op_plan_needs_op_granularity() -> None:
    ops = op_spec(builder("mlp")(), 2)
    plan = make_plan("mlp", _cut(ops.layer_names, "block1.0"), "gpipe")
    config = EngineConfig(plan=plan, model="mlp", model_args=model_args("mlp"))
    with pytest.raises(EngineError, match=r"'block0\.0'.*runs with --granularity op"):
        check_config(config)
    config.granularity = "op"
    assert check_config(config).stages[1].layers == ("block1.0", "block1.1", "head.linear")
    config.granularity = "ops"
    with pytest.raises(EngineError, match="granularity 'ops' is unknown"):
        check_config(config)
