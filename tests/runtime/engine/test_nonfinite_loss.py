"""A loss that becomes NaN or infinite (``on_nonfinite_loss``, worker.py): by default the
job ends at that step, every rank naming the step and the stage, within moments; with
``"continue"`` it trains on."""

import math
import time
from pathlib import Path
from typing import Any

import pytest

from pipestudio.runtime.engine import EngineConfig, EngineError, TrainResult, launch
from pipestudio.runtime.engine.checkpoint import read_latest
from pipestudio.runtime.engine.errors import NonFiniteLoss
from tests.runtime.engine.helpers import make_plan, model_args

PLAN = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
#: Adam moves every weight by about the learning rate: the tiny mlp's loss is NaN at step 1.
DIVERGING_LR = 1e15


def _launch(
    tmp_path: Path, on_nonfinite_loss: str, **settings: Any
) -> tuple[TrainResult, list[tuple[float, dict[str, Any]]], float]:
    """The job's result, its events with when each arrived, and when it ended."""
    events: list[tuple[float, dict[str, Any]]] = []
    config = EngineConfig(
        plan=PLAN,
        model="mlp",
        model_args=model_args("mlp"),
        steps=4,
        lr=DIVERGING_LR,
        threads_per_rank=1,
        timeout_s=15.0,
        on_nonfinite_loss=on_nonfinite_loss,  # type: ignore[arg-type]
        **settings,
    )
    result = launch(
        config, lambda event: events.append((time.monotonic(), event)), start_method="forkserver"
    )
    return result, events, time.monotonic()


def _losses(events: list[tuple[float, dict[str, Any]]]) -> list[tuple[int, float]]:
    return [
        (event["step"], event["loss"])
        for _, event in events
        if event["type"] == "step" and event["stage"] == 1
    ]


def test_a_nonfinite_loss_ends_the_job_naming_its_step_and_stage(tmp_path: Path) -> None:
    # a checkpoint is due at the end of step 1: rank 0 waits for rank 1's there
    result, events, ended = _launch(
        tmp_path, "fail", checkpoint_dir=str(tmp_path), checkpoint_every=2
    )
    losses = _losses(events)
    step = next(step for step, loss in losses if not math.isfinite(loss))
    assert step == 1 and math.isnan(losses[-1][1])
    assert [s for s, _ in losses] == [0, 1] and math.isfinite(losses[0][1])
    assert {
        event["step"] for _, event in events if event["type"] == "step" and event["stage"] == 0
    } >= {0, 1}
    reason = "loss is NaN at step 1 (stage 1)"

    assert not result.ok and not result.retry
    assert result.first_failed_rank == 1 and result.message.splitlines()[0] == reason
    assert result.exit_codes == {0: 1, 1: 1}  # both ended by themselves
    errors = {event["rank"]: event for _, event in events if event["type"] == "error"}
    assert errors[1] == {
        "type": "error",
        "rank": 1,
        "stage": 1,
        "replica": 0,
        "root_rank": 1,
        "message": reason,
        "cause": "nonfinite_loss",
        "retry": False,
    }
    assert errors[0]["message"].endswith(f": {reason}") and errors[0]["root_rank"] == 1
    assert errors[0]["retry"] is False and "cause" not in errors[0]

    nonfinite_at = next(
        at
        for at, event in events
        if event["type"] == "step" and event["stage"] == 1 and event["step"] == step
    )
    assert ended - nonfinite_at < 5.0  # not the 15 s timeout
    assert read_latest(str(tmp_path)) is None  # no checkpoint of the diverged weights


def test_continue_trains_every_step_and_reports_the_losses_as_they_are(tmp_path: Path) -> None:
    result, events, _ = _launch(tmp_path, "continue")
    assert result.ok, result.message
    losses = _losses(events)
    assert [step for step, _ in losses] == [0, 1, 2, 3]
    assert math.isfinite(losses[0][1]) and all(math.isnan(loss) for _, loss in losses[1:])


@pytest.mark.parametrize("loss,name", [(math.nan, "NaN"), (math.inf, "inf"), (-math.inf, "-inf")])
def test_the_reason_names_the_kind_of_loss(loss: float, name: str) -> None:
    failure = NonFiniteLoss(loss, 7, 2, 5)
    assert str(failure) == f"loss is {name} at step 7 (stage 2)"
    assert failure.root_rank == 5 and failure.cause == "nonfinite_loss" and not failure.retry


def test_an_unknown_setting_is_refused() -> None:
    config = EngineConfig(plan=PLAN, model="mlp", on_nonfinite_loss="ignore")  # type: ignore[arg-type]
    with pytest.raises(
        EngineError, match="on_nonfinite_loss 'ignore' is unknown; expected one of fail, continue"
    ):
        config.check()
