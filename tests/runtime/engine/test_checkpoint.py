"""Checkpoint and resume: a run stopped and resumed ends bitwise where an unbroken one does,
and a run that repartitioned live resumes on the partition it was checkpointed with."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pipestudio.runtime.engine import checkpoint as ckpt
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.repartition import RepartitionConfig, ScriptedMigration, with_stages
from tests.runtime.engine.helpers import (
    builder,
    final_params,
    make_plan,
    max_relative_difference,
    model_args,
    run,
)


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


def _stop_at_step_5(rank: int, op: Any) -> None:
    if op.step == 5:
        raise RuntimeError("stopped after the checkpoint of step 4")


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
@pytest.mark.parametrize("stopped", ["at its end", "by a fault"])
def test_a_resumed_run_makes_each_scripted_migration_once(schedule: str, stopped: str,
                                                          tmp_path: Path) -> None:
    """Migrations at steps 2, 4 and 6; the run resumes from its checkpoint of step 4. A run
    that ended at step 4 had not made the migration of step 4, which the resumed run
    makes at once; one stopped at step 5 had, and its checkpoint holds it. Either way the
    resumed run ends where the unbroken one does."""
    plan = make_plan("mlp", [["block0", "block1"], ["head"]], schedule)
    names = builder("mlp")().layer_names
    moves = RepartitionConfig(migrations=[ScriptedMigration(2, (("block1", 1),)),
                                          ScriptedMigration(4, (("block1", 0),)),
                                          ScriptedMigration(6, (("block1", 1),))])
    final = with_stages(plan, [["block0"], ["block1", "head"]])
    whole = tmp_path / "whole"
    unbroken: list[dict] = []
    assert run(plan, "mlp", 8, whole, unbroken.append, checkpoint_every=4,
               repartition=moves).ok
    made = _scheduled(unbroken)
    assert 4 in made  # (pipedream's lead moves the others)
    broken = tmp_path / "broken"
    if stopped == "at its end":
        assert run(plan, "mlp", 4, broken, repartition=moves).ok
    else:
        result = run(plan, "mlp", 8, broken, checkpoint_every=4, repartition=moves,
                     before_op=_stop_at_step_5)
        assert not result.ok
    assert json.loads((broken / "latest.json").read_text())["step"] == 4
    events: list[dict] = []
    result = run(plan, "mlp", 8, broken, events.append, resume=True, repartition=moves)
    assert result.ok, result.message
    assert _scheduled(events) == [step for step in made
                                  if step > 4 or (step == 4 and stopped == "at its end")]
    got, expected = final_params(broken, final, names), final_params(whole, final, names)
    assert max_relative_difference(got, expected) <= 1e-6


def _scheduled(events: list[dict]) -> list[int]:
    return [e["step"] for e in events if e["type"] == "migration" and e["phase"] == "scheduled"]
