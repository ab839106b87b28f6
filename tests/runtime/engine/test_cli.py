"""``pipestudio train`` on a plan made by ``pipestudio plan``: metrics and a trace come out;
a loss that becomes NaN fails it with the reason, unless told to continue."""

import json
from pathlib import Path

import pytest

from pipestudio.cli import main
from pipestudio.planner.formats.result import OpKind
from tests.runtime.engine.helpers import make_plan

TINY_MLP = [
    "--model",
    "mlp",
    "--model-arg",
    "layers=2",
    "--model-arg",
    "width=32",
    "--model-arg",
    "in_features=16",
]


def test_profile_plan_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile, plan = str(tmp_path / "profile.json"), str(tmp_path / "plan.json")
    metrics, trace = tmp_path / "metrics.jsonl", tmp_path / "trace.json"
    assert (
        main(
            [
                "profile",
                *TINY_MLP,
                "--microbatch-size",
                "2",
                "--repeats",
                "1",
                "--warmup",
                "1",
                "--threads",
                "1",
                "-o",
                profile,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "plan",
                profile,
                "--algorithm",
                "balance-time",
                "--stages",
                "2",
                "--microbatches",
                "4",
                "--schedule",
                "1f1b",
                "-o",
                plan,
            ]
        )
        == 0
    )
    capsys.readouterr()
    status = main(
        [
            "train",
            "--plan",
            plan,
            *TINY_MLP,
            "--steps",
            "3",
            "--threads-per-rank",
            "1",
            "--metrics",
            str(metrics),
            "--trace",
            str(trace),
        ]
    )
    err = capsys.readouterr().err
    assert status == 0, err
    assert "step 2: loss" in err and f"wrote {trace}" in err
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    kinds = {event["type"] for event in events}
    assert {"plan", "start", "op", "step", "memory", "summary"} <= kinds
    assert events[0] == {"type": "plan", "plan": json.loads(Path(plan).read_text())}
    ops = [event for event in events if event["type"] == "op"]
    assert {op["op"] for op in ops} <= set(OpKind.__args__)  # type: ignore[attr-defined]
    assert {(op["stage"], op["op"]) for op in ops} >= {
        (0, "forward"),
        (0, "backward"),
        (0, "update"),
        (0, "send_activation"),
        (1, "forward"),
        (1, "backward"),
        (1, "send_gradient"),
    }
    assert all(op["end_ms"] >= op["start_ms"] for op in ops)
    summary = next(event for event in events if event["type"] == "summary")
    assert summary["steps"] == [0, 1, 2] and all(loss > 0 for loss in summary["loss"])
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"forward 0", "backward 3", "memory", "process_name"} <= names
    calibrated = tmp_path / "calibrated.json"  # the run's plan from its metrics
    assert main(["calibrate", profile, str(metrics), "-o", str(calibrated)]) == 0
    assert "step" in capsys.readouterr().out and calibrated.exists()


def test_a_plan_for_another_model_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "format": "pipestudio.plan",
                "version": 1,
                "model": "gpt",
                "schedule": "gpipe",
                "num_microbatches": 2,
                "microbatch_size": 1,
                "stages": [{"layers": ["head"]}],
            }
        )
    )
    assert main(["train", "--plan", str(plan), *TINY_MLP, "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: the plan is for model 'gpt' but the model built is 'mlp'"]


@pytest.mark.parametrize("on_nonfinite_loss,status", [("fail", 1), ("continue", 0)])
def test_a_nonfinite_loss_fails_train_unless_told_to_continue(
    on_nonfinite_loss: str, status: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(make_plan("mlp", [["block0", "block1"], ["head"]], "1f1b").model_dump_json())
    argv = [
        "train",
        "--plan",
        str(plan),
        *TINY_MLP,
        "--model-arg",
        "out_features=5",
        "--steps",
        "2",
        "--threads-per-rank",
        "1",
        "--lr",
        "1e15",
    ]
    if on_nonfinite_loss == "continue":
        argv += ["--on-nonfinite-loss", "continue"]
    assert main(argv) == status
    err = capsys.readouterr().err
    assert "step 1: loss nan" in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    if status:
        assert errors[0] == "error: loss is NaN at step 1 (stage 1)", err
    else:
        assert errors == [], err


def test_fp16_pipedream_and_bad_loss_scales_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = make_plan("mlp", [["block0"], ["block1", "head"]], "pipedream", precision="fp16")
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert main(["train", "--plan", str(path), *TINY_MLP, "--steps", "1"]) == 2
    assert "precision 'fp16' needs a loss scale that all stages agree on" in (
        capsys.readouterr().err
    )
    path.write_text(plan.model_copy(update={"schedule": "1f1b"}).to_json())
    for flag, value, message in (
        ("--loss-scale", "0", "loss scale must be a finite number"),
        ("--loss-scale", "inf", "got inf"),
        ("--loss-scale-growth-interval", "0", "got 0"),
    ):
        assert main(["train", "--plan", str(path), *TINY_MLP, "--steps", "1", flag, value]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["zero-bubble", "interleaved-1f1b"])
def test_live_migration_under_the_new_schedules_is_refused_by_name(
    schedule: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    path.write_text(make_plan("mlp", [["block0"], ["block1", "head"]], schedule).to_json())
    argv = ["train", "--plan", str(path), *TINY_MLP, "--steps", "2", "--migrate", "1:block1@0"]
    assert main(argv) == 2
    assert f"live migration is not available under schedule {schedule!r}" in (
        capsys.readouterr().err
    )


def test_an_interleaved_plan_on_one_device_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = make_plan("mlp", [["block0"], ["block1", "head"]], "interleaved-1f1b", virtual_stages=2)
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert main(["train", "--plan", str(path), *TINY_MLP, "--steps", "1"]) == 2
    assert "interleaved-1f1b needs 2 or more devices to train" in capsys.readouterr().err
