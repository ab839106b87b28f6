"""Checkpoint and resume: a run stopped and resumed ends bitwise where an unbroken one does,
and a run that repartitioned live resumes on the partition it was checkpointed with."""

import json
from pathlib import Path

import pytest
import torch

from pipestudio.runtime.engine import checkpoint as ckpt
from pipestudio.runtime.engine.errors import EngineError
from pipestudio.runtime.engine.repartition import with_stages
from tests.runtime.engine.helpers import builder, final_params, make_plan, model_args, run


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
