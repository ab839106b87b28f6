"""fp16's dynamic loss scaling (``runtime/engine/execution/scaling.py``): a pipeline skips
exactly the steps that single-process training with ``torch.amp.GradScaler`` skips, when the
overflow shows on one rank only, and a resumed run goes on with the scale it stopped at."""

import itertools
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pipestudio.planner import Plan
from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    run,
)
from tests.runtime.engine.reference import BF16_TOLERANCE, train_scaled, train_single

STEPS = 10
#: Large enough that the first steps overflow by themselves in every stage (float16 ends
#: at 65504), and a growth interval short enough that the scale also grows in the run.
INIT_SCALE = 2.0**22
GROWTH_INTERVAL = 2
#: The step at which one parameter of the first stage gets an infinite gradient: an
#: overflow that only the ranks of stage 0 can see.
POISONED_STEP = 6
#: fp16 keeps 11 significant bits (bf16 8): the argument for ``BF16_TOLERANCE`` holds as
#: it is, and the fp32 run lies further than 100 x the bound from fp16's.
FP16_TOLERANCE = BF16_TOLERANCE


def poison(step: int, params: Mapping[str, nn.Parameter], *, at: int) -> None:
    """An infinite gradient in block0's first parameter at step ``at`` (where it is held)."""
    name = min(key for key in params if key.startswith("block0."))
    grad = params[name].grad if name in params else None
    if step == at and grad is not None:
        grad.view(-1)[0] = float("inf")


def poison_rank(rank: int, step: int, params: Mapping[str, nn.Parameter], *, at: int) -> None:
    if any(key.startswith("block0.") for key in params):
        poison(step, params, at=at)


def _scales(events: list[dict[str, Any]], plan: Plan) -> dict[tuple[int, int], list]:
    """Per (stage, replica), the (loss scale, overflowed) of each step, in step order."""
    result: dict[tuple[int, int], list] = {}
    for event in sorted((e for e in events if e["type"] == "step"), key=lambda e: e["step"]):
        result.setdefault((event["stage"], event["replica"]), []).append(
            (event["loss_scale"], event["overflowed"])
        )
    assert len(result) == sum(stage.replicas for stage in plan.stages)
    return result


@pytest.mark.parametrize(
    ("schedule", "replicas", "policies"),
    [("gpipe", [1, 1], {"block1": "swap"}), ("1f1b", [2, 1], {"block1": "recompute"})],
)
def test_every_rank_skips_the_steps_single_process_scaling_skips(
    schedule: str, replicas: list[int], policies: dict[str, str], tmp_path: Path
) -> None:
    plan = make_plan(
        "mlp",
        [["block0"], ["block1", "head"]],
        schedule,
        replicas=replicas,
        policies=policies,
        precision="fp16",
    )
    events: list[dict[str, Any]] = []
    result = run(
        plan,
        "mlp",
        STEPS,
        tmp_path,
        events.append,
        loss_scale=INIT_SCALE,
        loss_scale_growth_interval=GROWTH_INTERVAL,
        before_update=partial(poison_rank, at=POISONED_STEP),
    )
    assert result.ok, result.message
    expected, scales = train_scaled(
        builder("mlp"), plan, STEPS, INIT_SCALE, GROWTH_INTERVAL, partial(poison, at=POISONED_STEP)
    )
    # the reference overflowed by itself at first, at the poisoned step, and grew between
    skipped = [step for step, (_, overflowed) in enumerate(scales) if overflowed]
    assert skipped[0] == 0 and POISONED_STEP in skipped and len(skipped) < STEPS - 2
    assert any(later > earlier for (earlier, _), (later, _) in itertools.pairwise(scales))
    for ran in _scales(events, plan).values():
        assert ran == scales
    got = final_params(tmp_path, plan, builder("mlp")().layer_names)
    assert max_relative_difference(got, expected) <= FP16_TOLERANCE
    unpoisoned, _ = train_scaled(builder("mlp"), plan, STEPS, INIT_SCALE, GROWTH_INTERVAL)
    assert max_relative_difference(got, unpoisoned) > 100 * FP16_TOLERANCE  # a step was lost
    in_fp32 = train_single(builder("mlp"), plan.model_copy(update={"precision": "fp32"}), STEPS)
    assert max_relative_difference(got, in_fp32) > 100 * FP16_TOLERANCE  # fp16 did run


def test_a_resumed_run_goes_on_with_the_scale_it_stopped_at(tmp_path: Path) -> None:
    plan = make_plan("mlp", [["block0"], ["block1", "head"]], "1f1b", precision="fp16")
    settings = {"loss_scale": INIT_SCALE, "loss_scale_growth_interval": 3}
    whole: list[dict[str, Any]] = []
    assert run(plan, "mlp", STEPS, tmp_path / "whole", whole.append, **settings).ok
    broken = tmp_path / "broken"
    assert run(plan, "mlp", 4, broken, **settings).ok
    resumed: list[dict[str, Any]] = []
    result = run(plan, "mlp", STEPS, broken, resumed.append, resume=True, **settings)
    assert result.ok, result.message
    names = builder("mlp")().layer_names
    got, expected = final_params(broken, plan, names), final_params(tmp_path / "whole", plan, names)
    assert all(torch.equal(got[key], expected[key]) for key in expected)
    assert _scales(resumed, plan)[(0, 0)] == _scales(whole, plan)[(0, 0)][4:]
    assert len({scale for scale, _ in _scales(whole, plan)[(0, 0)]}) > 2  # it did change
