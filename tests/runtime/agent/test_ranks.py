"""How a RankGroup (runtime/agent/ranks.py) reports its ranks' end: the error
that names a cause comes first whatever the order the ranks' errors arrive in, and a
failure that another attempt would repeat is reported as not worth retrying."""

from typing import Any

import pytest

from pipestudio.runtime.agent.ranks import RankGroup, engine_config
from tests.runtime.engine.helpers import make_plan, model_args

PLAN = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
REASON = "loss is NaN at step 3 (stage 1)"
#: What rank 0 reports after its wait on rank 1 failed, and what rank 1 reports.
SECONDARY = {
    "type": "error",
    "rank": 0,
    "stage": 0,
    "replica": 0,
    "root_rank": 1,
    "message": f"rank 0 (stage 0 replica 0) stopped while receiving: {REASON}",
    "retry": False,
}
CAUSE = {
    "type": "error",
    "rank": 1,
    "stage": 1,
    "replica": 0,
    "root_rank": 1,
    "message": REASON,
    "cause": "nonfinite_loss",
    "retry": False,
}


def _config(**settings: Any) -> dict[str, Any]:
    return {
        "plan": PLAN.model_dump(mode="json"),
        "model": "mlp",
        "model_args": model_args("mlp"),
        "steps": 4,
        "device": "cpu",
        **settings,
    }


def _ended(events: list[dict[str, Any]], codes: list[int | None]) -> list[tuple[Any, ...]]:
    ends: list[tuple[Any, ...]] = []
    group = RankGroup(
        1,
        engine_config(_config()),
        [0, 1],
        None,  # type: ignore[arg-type]
        on_event=lambda event: None,
        on_end=lambda *end: ends.append(end),
    )
    for event in events:
        group.note_error(event)
    group.end(codes)
    return ends


@pytest.mark.parametrize("order", [[SECONDARY, CAUSE], [CAUSE, SECONDARY]])
def test_the_cause_is_reported_first_and_not_worth_retrying(order: list[dict[str, Any]]) -> None:
    assert _ended(order, [1, 1]) == [("failed", REASON, False)]


def test_any_error_that_says_so_makes_the_end_not_worth_retrying() -> None:
    # the ranks of this worker only saw their waits fail on a rank of another worker
    assert _ended([SECONDARY], [1]) == [("failed", SECONDARY["message"], False)]


def test_other_failures_report_the_first_error_and_may_be_retried() -> None:
    died = {"type": "error", "rank": 0, "root_rank": 1, "message": "rank 1 is dead"}
    later = {**died, "rank": 1, "message": "rank 1 failed: OSError"}
    assert _ended([died, later], [1, -9]) == [("failed", "rank 1 is dead", True)]
    assert _ended([], [0, 0]) == [("finished", None, True)]


def test_the_assignment_sets_what_a_nonfinite_loss_does() -> None:
    assert engine_config(_config()).on_nonfinite_loss == "fail"
    assert engine_config(_config(on_nonfinite_loss="continue")).on_nonfinite_loss == "continue"
    with pytest.raises(ValueError, match="on_nonfinite_loss 'ignore' is unknown"):
        engine_config(_config(on_nonfinite_loss="ignore"))
