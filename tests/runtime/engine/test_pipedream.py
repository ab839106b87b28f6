"""``pipedream`` equals the single-process emulation of weight stashing (and vertical sync)."""

from pathlib import Path

import pytest

from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    run,
)
from tests.runtime.engine.reference import BF16_TOLERANCE, train_pipedream, train_single

STEPS = 5
CASES = {
    "mlp": ([["block0"], ["block1"], ["head"]], "adam"),
    "gpt": ([["embed", "block0"], ["block1"], ["head"]], "momentum"),
    "unet": ([["enc0"], ["enc1", "bottom"], ["dec1"], ["dec0", "head"]], "adam"),
}


@pytest.mark.parametrize(
    "model,vertical_sync", [("mlp", False), ("mlp", True), ("gpt", False), ("unet", True)]
)
def test_pipedream_equals_weight_stashing_reference(
    model: str, vertical_sync: bool, tmp_path: Path
) -> None:
    stages, optimizer = CASES[model]
    plan = make_plan(model, stages, "pipedream", optimizer=optimizer, vertical_sync=vertical_sync)
    result = run(plan, model, STEPS, tmp_path)
    assert result.ok, result.message
    got = final_params(tmp_path, plan, builder(model)().layer_names)
    expected = train_pipedream(builder(model), plan, STEPS)
    assert max_relative_difference(got, expected) <= 1e-5
    # Stale weights make it differ from synchronous training, and the test can see that.
    assert max_relative_difference(got, train_single(builder(model), plan, STEPS)) > 1e-4


def test_vertical_sync_changes_the_result(tmp_path: Path) -> None:
    stages = CASES["mlp"][0]
    plain = train_pipedream(builder("mlp"), make_plan("mlp", stages, "pipedream"), STEPS)
    synced = train_pipedream(
        builder("mlp"), make_plan("mlp", stages, "pipedream", vertical_sync=True), STEPS
    )
    assert max_relative_difference(synced, plain) > 1e-5


def test_bf16_pipedream_with_vertical_sync_equals_the_autocast_reference(tmp_path: Path) -> None:
    """Weight stashing and vertical sync under bf16 autocast, with a swapped and a
    recomputed layer (the tolerance: ``reference.BF16_TOLERANCE``)."""
    stages, optimizer = CASES["gpt"]
    plan = make_plan(
        "gpt",
        stages,
        "pipedream",
        optimizer=optimizer,
        vertical_sync=True,
        policies={"block0": "swap", "block1": "recompute"},
        precision="bf16",
    )
    result = run(plan, "gpt", STEPS, tmp_path)
    assert result.ok, result.message
    got = final_params(tmp_path, plan, builder("gpt")().layer_names)
    assert (
        max_relative_difference(got, train_pipedream(builder("gpt"), plan, STEPS)) <= BF16_TOLERANCE
    )
    in_fp32 = train_pipedream(builder("gpt"), plan.model_copy(update={"precision": "fp32"}), STEPS)
    assert max_relative_difference(got, in_fp32) > 100 * BF16_TOLERANCE  # bf16 did run
