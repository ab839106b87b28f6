"""The `pipestudio profile` command (cli/runtime.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipestudio.cli import main
from pipestudio.cli import runtime as cli_runtime
from pipestudio.cli.runtime import BUILTIN_MODELS, ON_NONFINITE_LOSS
from pipestudio.planner import Profile, load_document
from pipestudio.runtime.engine import config as engine_config
from pipestudio.runtime.models import MODELS


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_profile_then_plan_then_simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile_path, plan_path = str(tmp_path / "out.json"), str(tmp_path / "plan.json")
    status, _, err = run(
        capsys,
        "profile",
        "--model",
        "mlp",
        "--microbatch-size",
        "4",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--threads",
        "1",
        "-o",
        profile_path,
    )
    assert status == 0 and f"wrote {profile_path}" in err
    profile = load_document(Profile, profile_path)
    assert profile.model == "mlp" and profile.microbatch_size == 4
    assert [layer.name for layer in profile.layers] == [
        "block0",
        "block1",
        "block2",
        "block3",
        "head",
    ]
    assert (
        run(
            capsys,
            "plan-template",
            profile_path,
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            "1f1b",
            "-o",
            plan_path,
        )[0]
        == 0
    )
    status, out, _ = run(capsys, "simulate", profile_path, plan_path, "--json")
    assert status == 0
    assert len(json.loads(out)["stages"]) == 2


def test_profile_prints_json_with_model_args(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        "profile",
        "--model",
        "unet",
        "--model-arg",
        "depth=1",
        "--model-arg",
        "width=2",
        "--model-arg",
        "image_size=8",
        "--microbatch-size",
        "1",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--optimizer",
        "sgd",
    )
    assert status == 0
    profile = json.loads(out)
    assert [layer["name"] for layer in profile["layers"]] == ["enc0", "bottom", "dec0", "head"]
    assert {"src": "enc0", "dst": "dec0"} in profile["edges"]
    assert profile["metadata"]["optimizer"] == "sgd"


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--model", "nosuch"],
            "error: unknown model 'nosuch'; expected one of dynamic, gpt, "
            "mlp, resnet, unet or MODULE:FACTORY",
        ),
        (
            ["--model", "mlp", "--model-arg", "widht=3"],
            "error: model 'mlp' has no argument 'widht'",
        ),
        (
            ["--model", "mlp", "--model-arg", "width"],
            "error: --model-arg 'width' must look like KEY=VALUE",
        ),
        (["--model", "mlp", "--device", "npu"], "error: device 'npu' is not understood"),
    ],
)
def test_errors_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "profile", "--microbatch-size", "2", *argv)
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), err


def test_builtin_names_in_the_help_match_the_registry() -> None:
    assert tuple(MODELS) == BUILTIN_MODELS


def test_nonfinite_loss_choices_match_the_engine() -> None:
    assert ON_NONFINITE_LOSS == engine_config.ON_NONFINITE_LOSS


def test_loss_scale_defaults_match_the_engine() -> None:
    from pipestudio.runtime.engine.execution import scaling

    assert (cli_runtime.INIT_SCALE, cli_runtime.GROWTH_INTERVAL) == (
        scaling.INIT_SCALE,
        scaling.GROWTH_INTERVAL,
    )


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys; from pipestudio.cli import build_parser; build_parser(); "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
