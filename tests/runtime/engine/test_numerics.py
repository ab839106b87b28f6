"""Synchronous schedules compute what single-process training computes (engine numerics)."""

from pathlib import Path
from typing import Any

import pytest

from pipestudio.planner import Plan
from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    run,
)
from tests.runtime.engine.reference import BF16_TOLERANCE, train_single

STEPS = 5
#: Steps of the zero-bubble and interleaved runs: each step is a flush, so three show all
#: there is to see (a step's ops and the update between steps) at less cost.
NEW_STEPS = 3
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


@pytest.mark.parametrize(
    ("model", "policies"),
    [
        ("mlp", {}),
        ("mlp", {"block0": "swap", "block1": "recompute"}),
        ("unet", {"enc1": "recompute", "bottom": "recompute", "dec1": "swap"}),
    ],
)
def test_zero_bubble_equals_single_process(
    model: str, policies: dict[str, str], tmp_path: Path
) -> None:
    """The backward split in two (input half, then the weight half s backwards later at
    stage s) sums the same gradients: 2 to 4 ranks, with recompute and swap."""
    plan = make_plan(
        model, SPLITS[model], "zero-bubble", optimizer=OPTIMIZER[model], policies=policies
    )
    events = _equals_single_process(plan, model, {}, tmp_path)
    weights = [e for e in events if e.get("type") == "op" and e.get("op") == "weight"]
    assert len(weights) == NEW_STEPS * plan.num_microbatches * plan.num_stages, len(weights)


#: gpt with six blocks: eight layers, one per chunk of 4 ranks x 2 chunks.
DEEP_GPT = {"layers": 6}
GPT = ["embed", "block0", "block1", "head"]
DEEP = ["embed", *(f"block{idx}" for idx in range(6)), "head"]


@pytest.mark.parametrize(
    ("chunks", "ranks", "policies"),
    [
        ([[name] for name in GPT], 2, {}),
        ([[name] for name in GPT], 2, {"embed": "swap", "block0": "recompute"}),
        ([[name] for name in DEEP], 4, {"block1": "recompute", "block4": "swap"}),
    ],
)
def test_interleaved_1f1b_equals_single_process(
    chunks: list[list[str]], ranks: int, policies: dict[str, str], tmp_path: Path
) -> None:
    """Each rank runs its chunks (d, d + p, ...) in Megatron-LM's order; the result is
    single-process training's, at 2 and 4 ranks with recompute and swap."""
    changes = DEEP_GPT if len(chunks) == len(DEEP) else {}
    plan = make_plan(
        "gpt",
        chunks,
        "interleaved-1f1b",
        optimizer="momentum",
        policies=policies,
        virtual_stages=len(chunks) // ranks,
        num_microbatches=4,
    )
    events = _equals_single_process(plan, "gpt", changes, tmp_path)
    starts = [e for e in events if e.get("type") == "start"]
    assert len(starts) == ranks and {e["world_size"] for e in starts} == {ranks}
    # every chunk ran on its rank: the ops of chunk c carry stage c
    stages = {e["stage"] for e in events if e.get("type") == "op" and e.get("op") == "forward"}
    assert stages == set(range(len(chunks)))


def _equals_single_process(
    plan: Plan, model: str, changes: dict[str, int], tmp_path: Path
) -> list[dict[str, Any]]:
    """Train ``plan`` for ``NEW_STEPS``, check it ends where one process does (and that it
    trained at all); the run's events."""
    events: list[dict[str, Any]] = []
    result = run(plan, model, NEW_STEPS, tmp_path, events.append, model_changes=changes)
    assert result.ok, result.message
    spec = builder(model, **changes)()
    got = final_params(tmp_path, plan, spec.layer_names)
    expected = train_single(builder(model, **changes), plan, NEW_STEPS)
    assert max_relative_difference(got, expected) <= 1e-5
    initial = {f"{n}.{k}": v.detach() for n, m in spec.layers for k, v in m.named_parameters()}
    assert max_relative_difference(got, initial) > 1e-4  # it did train
    return events
