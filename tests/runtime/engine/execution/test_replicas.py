"""Replicated stages all-reduce their gradients: synchronous runs still equal one process."""

from pathlib import Path

import pytest

from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    run,
)
from tests.runtime.engine.reference import train_single

STEPS = 4


@pytest.mark.parametrize(
    "model,stages,replicas,schedule",
    [
        ("mlp", [["block0"], ["block1", "head"]], [2, 1], "gpipe"),
        ("mlp", [["block0"], ["block1", "head"]], [1, 2], "1f1b"),
        ("unet", [["enc0", "enc1"], ["bottom", "dec1"], ["dec0", "head"]], [1, 2, 1], "1f1b"),
    ],
)
def test_replicated_stages_equal_single_process(
    model: str, stages: list[list[str]], replicas: list[int], schedule: str, tmp_path: Path
) -> None:
    plan = make_plan(model, stages, schedule, replicas=replicas)
    result = run(plan, model, STEPS, tmp_path)
    assert result.ok, result.message
    got = final_params(tmp_path, plan, builder(model)().layer_names)
    expected = train_single(builder(model), plan, STEPS)
    assert max_relative_difference(got, expected) <= 1e-5
