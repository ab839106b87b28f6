"""A dead or hung rank: every other rank ends within 30 s with an error naming it."""

import os
import time
from pathlib import Path

from pipestudio.runtime.engine import EngineConfig, Op, launch
from tests.runtime.engine.helpers import make_plan, model_args

PLAN = make_plan("mlp", [["block0"], ["block1"], ["head"]], "1f1b")


def die_at_step_2(rank: int, op: Op) -> None:
    if rank == 1 and op.step == 2 and op.kind == "backward":
        os._exit(13)


def hang_at_step_1(rank: int, op: Op) -> None:
    if rank == 1 and op.step == 1 and op.kind == "forward":
        time.sleep(120)


def _launch(hook: object, timeout_s: float, grace_s: float, tmp_path: Path) -> tuple:
    config = EngineConfig(
        plan=PLAN,
        model="mlp",
        model_args=model_args("mlp"),
        steps=6,
        threads_per_rank=1,
        timeout_s=timeout_s,
        before_op=hook,  # type: ignore[arg-type]
        metrics_path=str(tmp_path / "metrics.jsonl"),
    )
    started = time.monotonic()
    result = launch(config, start_method="forkserver", grace_s=grace_s)
    return result, time.monotonic() - started


def test_a_killed_rank_is_named_by_every_other_rank(tmp_path: Path) -> None:
    result, elapsed_s = _launch(die_at_step_2, 10.0, 60.0, tmp_path)
    assert not result.ok
    assert result.first_failed_rank == 1 and result.exit_codes[1] == 13
    # The others ended by themselves (status 1, not killed by the launcher), in time.
    assert result.exit_codes[0] == 1 and result.exit_codes[2] == 1
    assert elapsed_s < 30.0
    for rank in (0, 2):
        assert "rank 1 (stage 1 replica 0) is dead or frozen" in result.errors[rank], result.errors[
            rank
        ]
    assert result.message.startswith("rank 1 exited with status 13")


def test_a_hung_rank_is_named_by_every_other_rank(tmp_path: Path) -> None:
    result, elapsed_s = _launch(hang_at_step_1, 5.0, 3.0, tmp_path)
    assert not result.ok
    assert result.exit_codes[0] == 1 and result.exit_codes[2] == 1
    assert result.exit_codes[1] not in (0, 1)  # the launcher terminated it
    for rank in (0, 2):
        assert (
            "rank 1 (stage 1 replica 0) hung: busy with the forward of micro-batch"
            in result.errors[rank]
        ), result.errors[rank]
    assert elapsed_s < 30.0
