"""The control of live repartition: commands through the Python API, the online planner's
proposals (applied or held), and clear refusals of bad requests."""

import time
from pathlib import Path
from typing import Any

import pytest

from pipestudio.cli import main
from pipestudio.runtime.engine import EngineConfig
from pipestudio.runtime.engine.job import Job
from pipestudio.runtime.engine.migration.settings import MigrationSettings
from tests.runtime.engine.helpers import make_plan

MLP = {"layers": "3", "width": "16", "in_features": "8", "out_features": "4"}
DYNAMIC = {
    "layers": "4",
    "width": "64",
    "heads": "2",
    "seq_len": "32",
    "vocab": "64",
    "num_active": "4",
    "switch_every": "100",
}


def _config(
    plan: Any, model: str, args: dict[str, str], steps: int, repartition: MigrationSettings
) -> EngineConfig:
    return EngineConfig(
        plan=plan,
        model=model,
        model_args=args,
        steps=steps,
        threads_per_rank=1,
        timeout_s=20.0,
        migration=repartition,
    )


def test_controller_migrates_a_running_job(tmp_path: Path) -> None:
    plan = make_plan("mlp", [["block0"], ["block1", "block2"], ["head"]], "1f1b")
    job = Job(
        _config(plan, "mlp", MLP, 12, MigrationSettings(control_dir=str(tmp_path))),
        start_method="forkserver",
    ).start()
    while job.last_step() < 1 and job.result is None:
        time.sleep(0.05)
    seq = job.controller.migrate(moves=[("block1", 0)])
    bad = job.controller.migrate(moves=[("block9", 1)])
    status = job.controller.wait_status(seq)
    result = job.wait(120)
    assert result.ok, result.message
    assert status["accepted"] and status["step"] >= 2
    assert "block9" in job.controller.wait_status(bad)["reason"]
    done = [e for e in job.events if e["type"] == "migration" and e["phase"] == "done"]
    assert {e["stage"] for e in done} == {0, 1} and all(e["step"] == status["step"] for e in done)


@pytest.mark.parametrize("auto", [True, False])
def test_online_planner_repairs_an_imbalance(auto: bool, tmp_path: Path) -> None:
    plan = make_plan(
        "dynamic",
        [["embed"], ["block0", "block1", "block2", "block3", "head"]],
        "1f1b",
        microbatch_size=4,
    )
    settings = MigrationSettings(every=2, auto=auto, control_dir=str(tmp_path))
    job = Job(_config(plan, "dynamic", DYNAMIC, 8, settings), start_method="forkserver").start()
    result = job.wait(180)
    assert result.ok, result.message
    proposals = [e for e in job.events if e["type"] == "proposal"]
    assert proposals and proposals[0]["worthwhile"], proposals
    assert proposals[0]["moves"] and proposals[0]["gain_fraction"] > 0.05
    scheduled = [e for e in job.events if e["type"] == "migration" and e["phase"] == "scheduled"]
    if auto:
        assert scheduled and scheduled[0]["source"] == "auto"
        assert {m["layer"] for m in scheduled[0]["moves"]} <= {"block0", "block1", "block2"}
    else:
        assert not scheduled
        held = job.controller.proposals()
        assert held and held[0]["status"] == "held" and held[0]["proposal"]["worthwhile"]


def test_cli_refuses_bad_migrations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = make_plan("mlp", [["block0"], ["block1", "block2", "head"]], "1f1b", replicas=[2, 1])
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    argv = [
        "train",
        "--plan",
        str(path),
        "--model",
        "mlp",
        "--model-arg",
        "layers=3",
        "--steps",
        "2",
    ]
    assert main([*argv, "--migrate", "2:block1"]) == 2
    assert "LAYER@STAGE" in capsys.readouterr().err
    assert main([*argv, "--migrate", "1:block1@0"]) == 2
    assert "stage 0 has 2 replicas" in capsys.readouterr().err
    assert main([*argv, "--auto-repartition"]) == 2
    assert "--repartition-every" in capsys.readouterr().err
