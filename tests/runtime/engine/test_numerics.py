"""Synchronous schedules compute what single-process training computes (engine numerics)."""

from pathlib import Path

import pytest

from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    run,
)
from tests.runtime.engine.reference import BF16_TOLERANCE, train_single

STEPS = 5
SPLITS = {
    "mlp": [["block0"], ["block1", "head"]],
    "gpt": [["embed"], ["block0", "block1"], ["head"]],
    "unet": [["enc0"], ["enc1", "bottom"], ["dec1"], ["dec0", "head"]],
}
#: gpt's key bias has a gradient of exactly zero in exact arithmetic (softmax ignores a
#: shift shared by all keys), so what it gets is rounding noise, which depends on the order
#: of the sums; Adam divides it by its own size and turns it into lr-sized steps. With
#: momentum SGD the pipeline and the single process agree to 1e-7.
OPTIMIZER = {"mlp": "adam", "gpt": "momentum", "unet": "adam"}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("model", sorted(SPLITS))
def test_synchronous_schedules_equal_single_process(
    model: str, schedule: str, tmp_path: Path
) -> None:
    plan = make_plan(model, SPLITS[model], schedule, optimizer=OPTIMIZER[model])
    result = run(plan, model, STEPS, tmp_path)
    assert result.ok, result.message
    spec = builder(model)()
    got = final_params(tmp_path, plan, spec.layer_names)
    expected = train_single(builder(model), plan, STEPS)
    assert max_relative_difference(got, expected) <= 1e-5
    initial = {f"{n}.{k}": v.detach() for n, m in spec.layers for k, v in m.named_parameters()}
    assert max_relative_difference(got, initial) > 1e-4  # it did train


@pytest.mark.parametrize(
    ("schedule", "policies"),
    [
        ("gpipe", {}),
        ("1f1b", {}),
        ("1f1b", {"block1": "recompute"}),
        ("gpipe", {"block0": "swap", "block1": "recompute"}),
    ],
)
def test_bf16_pipelines_equal_single_process_autocast(
    schedule: str, policies: dict[str, str], tmp_path: Path
) -> None:
    split = [["embed", "block0"], ["block1", "head"]]
    plan = make_plan(
        "gpt", split, schedule, optimizer="momentum", policies=policies, precision="bf16"
    )
    result = run(plan, "gpt", STEPS, tmp_path)
    assert result.ok, result.message
    got = final_params(tmp_path, plan, builder("gpt")().layer_names)
    expected = train_single(builder("gpt"), plan, STEPS)
    assert max_relative_difference(got, expected) <= BF16_TOLERANCE
    in_fp32 = train_single(builder("gpt"), plan.model_copy(update={"precision": "fp32"}), STEPS)
    assert max_relative_difference(got, in_fp32) > 100 * BF16_TOLERANCE  # bf16 did run
