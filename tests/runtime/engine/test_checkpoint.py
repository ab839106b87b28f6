"""Checkpoint and resume: a run stopped and resumed ends bitwise where an unbroken one does,
and a run that repartitioned live resumes on the partition it was checkpointed with."""

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from pipestudio.planner import Plan
from pipestudio.runtime.engine import checkpoint as ckpt
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.migration.commands import Controller
from pipestudio.runtime.engine.migration.settings import (
    MigrationSettings,
    ScriptedMigration,
    new_plan,
    with_stages,
)
from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    model_args,
    run,
)
from tests.runtime.engine.reference import BF16_TOLERANCE, train_single


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
def test_resume_equals_the_uninterrupted_run(schedule: str, tmp_path: Path) -> None:
    plan = make_plan("mlp", [["block0"], ["block1"], ["head"]], schedule)
    names = builder("mlp")().layer_names
    whole = tmp_path / "whole"
    assert run(plan, "mlp", 5, whole, checkpoint_every=3).ok
    broken = tmp_path / "broken"
    assert run(plan, "mlp", 3, broken).ok
    assert json.loads((broken / "latest.json").read_text())["step"] == 3
    events: list[dict] = []
    result = run(plan, "mlp", 5, broken, events.append, resume=True)
    assert result.ok, result.message
    assert {e["start_step"] for e in events if e["type"] == "start"} == {3}
    assert result.summary is not None and result.summary["steps"] == [3, 4]
    got, expected = final_params(broken, plan, names), final_params(whole, plan, names)
    assert all(torch.equal(got[key], expected[key]) for key in expected)
    assert sorted(p.name for p in broken.iterdir()) == ["latest.json", "step-00000005"]


@pytest.mark.parametrize(
    ("model", "stages", "schedule", "chunks"),
    [
        ("mlp", [["block0"], ["block1"], ["head"]], "zero-bubble", 1),
        ("gpt", [["embed"], ["block0"], ["block1"], ["head"]], "interleaved-1f1b", 2),
    ],
)
def test_the_new_schedules_resume_where_the_uninterrupted_run_is(
    model: str, stages: list[list[str]], schedule: str, chunks: int, tmp_path: Path
) -> None:
    """zero-bubble (its weight halves all done by the step's end) and interleaved-1f1b
    (every chunk checkpoints; rank 0 publishes once all have) resume bitwise."""
    plan = make_plan(model, stages, schedule, virtual_stages=chunks, optimizer="momentum")
    names = builder(model)().layer_names
    whole = tmp_path / "whole"
    assert run(plan, model, 3, whole, checkpoint_every=2).ok
    broken = tmp_path / "broken"
    assert run(plan, model, 2, broken).ok
    result = run(plan, model, 3, broken, resume=True)
    assert result.ok, result.message
    assert result.summary is not None and result.summary["steps"] == [2]
    got, expected = final_params(broken, plan, names), final_params(whole, plan, names)
    assert all(torch.equal(got[key], expected[key]) for key in expected)
    step = broken / "step-00000003"
    assert sorted(p.name for p in step.glob("stage*")) == [
        f"stage{idx}-replica0.pt" for idx in range(len(stages))
    ]


def test_a_bf16_run_resumed_equals_the_single_process_autocast_run(tmp_path: Path) -> None:
    """A bf16 run stopped after step 3 and resumed ends where single-process autocast
    training does (``reference.BF16_TOLERANCE``), with a recomputed layer."""
    plan = make_plan(
        "gpt",
        [["embed", "block0"], ["block1", "head"]],
        "1f1b",
        optimizer="momentum",
        policies={"block1": "recompute"},
        precision="bf16",
    )
    assert run(plan, "gpt", 3, tmp_path).ok
    result = run(plan, "gpt", 5, tmp_path, resume=True)
    assert result.ok, result.message
    assert result.summary is not None and result.summary["steps"] == [3, 4]
    got = final_params(tmp_path, plan, builder("gpt")().layer_names)
    assert max_relative_difference(got, train_single(builder("gpt"), plan, 5)) <= BF16_TOLERANCE
    in_fp32 = train_single(builder("gpt"), plan.model_copy(update={"precision": "fp32"}), 5)
    assert max_relative_difference(got, in_fp32) > 100 * BF16_TOLERANCE  # bf16 did run


def test_a_run_repartitioned_live_resumes_on_its_checkpoint_partition(tmp_path: Path) -> None:
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
    moved = with_stages(plan, [["block0"], ["block1", "head"]])
    ckpt.publish(str(tmp_path), 4, moved, "mlp", model_args("mlp"))
    assert ckpt.resume_plan(str(tmp_path), plan) == moved
    assert ckpt.check_compatible(str(tmp_path), moved, "mlp", model_args("mlp")) == 4
    other = make_plan("mlp", [["block0", "block1"], ["head"]], "gpipe")
    assert ckpt.resume_plan(str(tmp_path), other) is other
    with pytest.raises(EngineError, match="made with another plan"):
        ckpt.check_compatible(str(tmp_path), other, "mlp", model_args("mlp"))
    assert ckpt.resume_plan(str(tmp_path / "none"), plan) is plan


def _stop_at(step: int, rank: int, op: Any) -> None:
    if op.step == step:
        raise RuntimeError(f"stopped after the checkpoint of step {step - 1}")


def _stop_and_resume(
    plan: Plan,
    migrations: MigrationSettings,
    steps: int,
    checkpoint: int,
    stopped: str,
    tmp_path: Path,
) -> tuple[list[dict], dict[str, Any], list[dict]]:
    """Train ``steps`` steps unbroken, checkpointing every ``checkpoint``; again, stopped
    after the checkpoint of step ``checkpoint`` (at the run's end, or by a fault in the
    next step) and resumed to ``steps``, which must end where the unbroken run ends (on
    the last migration's partition). The unbroken run's events, the stopped run's
    ``latest.json`` and the resumed run's events."""
    names = builder("mlp")().layer_names
    unbroken: list[dict] = []
    assert run(
        plan,
        "mlp",
        steps,
        tmp_path / "whole",
        unbroken.append,
        checkpoint_every=checkpoint,
        migration=migrations,
    ).ok
    broken = tmp_path / "broken"
    if stopped == "at its end":
        assert run(plan, "mlp", checkpoint, broken, migration=migrations).ok
    else:
        result = run(
            plan,
            "mlp",
            steps,
            broken,
            checkpoint_every=checkpoint,
            migration=migrations,
            before_op=partial(_stop_at, checkpoint + 1),
        )
        assert not result.ok
    meta = json.loads((broken / "latest.json").read_text())
    assert meta["step"] == checkpoint
    resumed: list[dict] = []
    result = run(plan, "mlp", steps, broken, resumed.append, resume=True, migration=migrations)
    assert result.ok, result.message
    final = new_plan(plan, [m for s in migrations.migrations for m in s.moves], names)
    got = final_params(broken, final, names)
    assert max_relative_difference(got, final_params(tmp_path / "whole", final, names)) <= 1e-6
    return unbroken, meta, resumed


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
@pytest.mark.parametrize("stopped", ["at its end", "by a fault"])
def test_a_resumed_run_makes_each_scripted_migration_once(
    schedule: str, stopped: str, tmp_path: Path
) -> None:
    """Migrations at steps 2, 4 and 6; the run resumes from its checkpoint of step 4. A run
    that ended at step 4 had not made the migration of step 4, which the resumed run
    makes at once; one stopped at step 5 had, and its checkpoint holds it. Either way the
    resumed run ends where the unbroken one does."""
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], schedule)
    moves = MigrationSettings(
        migrations=[
            ScriptedMigration(2, (("block1", 1),)),
            ScriptedMigration(4, (("block1", 0),)),
            ScriptedMigration(6, (("block1", 1),)),
        ]
    )
    unbroken, _, resumed = _stop_and_resume(plan, moves, 8, 4, stopped, tmp_path)
    made = _scheduled(unbroken)
    assert 4 in made  # (pipedream's lead moves the others)
    assert _scheduled(resumed) == [
        step for step in made if step > 4 or (step == 4 and stopped == "at its end")
    ]


@pytest.mark.parametrize("stopped", ["at its end", "by a fault"])
def test_a_migration_postponed_past_the_checkpoint_is_made_after_resuming(
    stopped: str, tmp_path: Path
) -> None:
    """Migrations scripted at steps 2, 2 and 3 follow one another at steps 2, 3 and 4. A
    run stopped by a fault after its checkpoint of step 3 had decided all three, and that
    checkpoint holds the first two: the resumed run makes the third, at 4. A run that
    ended at step 3 had made only the first: the resumed run makes the others at once, at
    3 and 4. Either way it ends where the unbroken one does."""
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
    moves = MigrationSettings(
        migrations=[
            ScriptedMigration(2, (("block1", 1),)),
            ScriptedMigration(2, (("block1", 0),)),
            ScriptedMigration(3, (("block1", 1),)),
        ]
    )
    unbroken, meta, resumed = _stop_and_resume(plan, moves, 6, 3, stopped, tmp_path)
    assert _scheduled(unbroken) == [2, 3, 4]
    record = meta["repartition"]
    assert record["scripted"] == [  # each made or queued
        {"index": 0, "step": 2, "moves": [["block1", 1]], "due": None},
        {"index": 1, "step": 2, "moves": [["block1", 0]], "due": None},
        {"index": 2, "step": 3, "moves": [["block1", 1]], "due": None},
    ]
    queued = [
        (q["request"]["index"], q["request"]["step"], q["effective"]) for q in record["queued"]
    ]
    assert queued == ([(1, 2, None), (2, 3, None)] if stopped == "at its end" else [(2, 3, 4)])
    assert _scheduled(resumed) == ([3, 4] if stopped == "at its end" else [4])


def test_a_run_resumed_twice_makes_every_migration(tmp_path: Path) -> None:
    """Five migrations scripted at step 2 take effect at steps 2 to 6, all decided at step
    1. A run checkpointing every step fails at step 3 and its resumption at step 4: the
    second resumption still makes the migrations due at 5 and 6, which the first had not
    taken up when it checkpointed step 4."""
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
    moves = MigrationSettings(
        migrations=[ScriptedMigration(2, (("block1", 1 - i % 2),)) for i in range(5)]
    )
    folder = tmp_path / "run"
    scheduled = []
    for resume, stop in ((False, 3), (True, 4), (True, None)):
        events: list[dict] = []
        result = run(
            plan,
            "mlp",
            8,
            folder,
            events.append,
            checkpoint_every=1,
            migration=moves,
            resume=resume,
            before_op=partial(_stop_at, stop) if stop else None,
        )
        assert result.ok == (stop is None), result.message
        scheduled.append(_scheduled(events))
    assert scheduled[0] == [2, 3, 4, 5, 6] and scheduled[1][0] == 4
    assert scheduled[2] == [5, 6]


def _scheduled(events: list[dict]) -> list[int]:
    return [e["step"] for e in events if e["type"] == "migration" and e["phase"] == "scheduled"]


def test_a_move_added_before_the_step_resumed_at_is_reported(tmp_path: Path) -> None:
    """A run resumed with a ``--migrate`` list that gained moves at steps before the one it
    resumes at cannot make them where they were asked: a ``rejected`` event names each,
    the move the stopped run made is not reported though its place in the list moved, and
    the later move is made. Resumed once more, the run reports the same two and no other."""
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
    made = ScriptedMigration(2, (("block1", 1),))
    folder = tmp_path / "run"
    assert run(plan, "mlp", 4, folder, migration=MigrationSettings(migrations=[made])).ok
    later = [
        ScriptedMigration(1, (("block0", 1),)),
        made,
        ScriptedMigration(3, (("block1", 0),)),
        ScriptedMigration(5, (("block1", 0),)),
    ]
    events: list[dict] = []
    result = run(
        plan,
        "mlp",
        7,
        folder,
        events.append,
        resume=True,
        migration=MigrationSettings(migrations=later),
    )
    assert result.ok, result.message
    assert _scheduled(events) == [5]
    rejected = [e for e in events if e["type"] == "migration" and e["phase"] == "rejected"]
    assert [e["source"] for e in rejected] == ["scripted", "scripted"]
    assert "--migrate 1:block0@1 is for step 1, before step 4" in rejected[0]["reason"]
    assert "--migrate 3:block1@0 is for step 3, before step 4" in rejected[1]["reason"]
    again: list[dict] = []
    assert run(
        plan,
        "mlp",
        9,
        folder,
        again.append,
        resume=True,
        migration=MigrationSettings(migrations=later),
    ).ok
    assert _scheduled(again) == []
    reasons = [e["reason"] for e in again if e["type"] == "migration" and e["phase"] == "rejected"]
    assert [reason.split(" is for")[0] for reason in reasons] == [
        "--migrate 1:block0@1",
        "--migrate 3:block1@0",
    ]


def test_a_checkpoint_cut_takes_one_migration_the_next_comes_after_it(tmp_path: Path) -> None:
    """pipedream: a switch announced across a checkpoint cut moves back to the cut (step 4);
    one decided with it, moving the same layer back, waits until after the cut (step 6)
    instead of switching at the same micro-batch."""
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], "pipedream")
    moves = MigrationSettings(
        migrations=[ScriptedMigration(5, (("block1", 1),)), ScriptedMigration(5, (("block1", 0),))]
    )
    events: list[dict] = []
    result = run(plan, "mlp", 8, tmp_path, events.append, checkpoint_every=4, migration=moves)
    assert result.ok, result.message
    assert _scheduled(events) == [4, 6]


@pytest.mark.parametrize("directory", ["the same", "a fresh one"])
def test_a_resumed_run_reads_the_control_directory_on_from_where_it_stopped(
    directory: str, tmp_path: Path
) -> None:
    """Commands read before the checkpoint are not read again (the migration of step 2 is
    not made a second time); one read but not in effect yet (step 5) is made. A resumed
    run given a fresh directory (as the agent does for each attempt) reads all of its
    commands, and writes nothing there about those of the old one."""
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
    old = Controller(str(tmp_path / "control"))
    first = old.migrate([("block1", 1)], step=2)
    second = old.migrate([("block1", 0)], step=5)
    events: list[dict] = []
    assert run(
        plan,
        "mlp",
        4,
        tmp_path / "run",
        events.append,
        migration=MigrationSettings(control_dir=old.control_dir),
    ).ok
    assert _scheduled(events) == [2] and old.status(first)["step"] == 2
    record = json.loads((tmp_path / "run" / "latest.json").read_text())["repartition"]
    assert record["seen"] == 2
    assert [(q["request"]["seq"], q["effective"]) for q in record["queued"]] == [(2, None)]
    new = old if directory == "the same" else Controller(str(tmp_path / "fresh"))
    later = new.migrate([("block1", 1)], step=6)
    events = []
    assert run(
        plan,
        "mlp",
        8,
        tmp_path / "run",
        events.append,
        resume=True,
        migration=MigrationSettings(control_dir=new.control_dir),
    ).ok
    assert _scheduled(events) == [5, 6]
    assert old.status(first)["step"] == 2 and new.status(later)["step"] == 6
    if directory == "the same":
        assert old.status(second)["step"] == 5
    else:
        assert new.status(second) is None  # (the fresh directory's own command 2, later)
        assert later == 1


def test_the_online_planner_goes_on_measuring_after_a_resume(tmp_path: Path) -> None:
    """Windows of 2 steps: a run resumed at step 3 evaluates its first whole window (steps
    4 and 5) and the later ones (it used to wait for the window of steps 2 and 3, whose
    measurements the stopped run took with it)."""
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b")
    settings = MigrationSettings(every=2, control_dir=str(tmp_path / "control"))
    stopped: list[dict] = []
    assert run(plan, "mlp", 3, tmp_path / "run", stopped.append, migration=settings).ok
    resumed: list[dict] = []
    assert run(
        plan, "mlp", 10, tmp_path / "run", resumed.append, resume=True, migration=settings
    ).ok
    windows = [e["window_step"] for e in resumed if e["type"] == "proposal"]
    assert windows and windows[0] == 5 and set(windows) <= {5, 7, 9}
