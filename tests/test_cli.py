"""The command line contract that scripts and the other components rely on."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipestudio.cli import main
from tests.conftest import PIPEDREAM_DIR


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    paths = {name: str(tmp_path / f"{name}.json") for name in ("profile", "plan", "cluster")}
    assert (
        run(
            capsys,
            "import-pipedream",
            str(PIPEDREAM_DIR / "resnet50" / "graph.txt"),
            "--batch-size",
            "128",
            "-o",
            paths["profile"],
        )[0]
        == 0
    )
    assert (
        run(
            capsys,
            "plan-template",
            paths["profile"],
            "--stages",
            "4",
            "--microbatches",
            "8",
            "--schedule",
            "1f1b",
            "-o",
            paths["plan"],
        )[0]
        == 0
    )
    assert (
        run(
            capsys,
            "cluster-template",
            "--devices",
            "2,2",
            "--bandwidth-gbps",
            "400,100",
            "--device-memory",
            "16GiB",
            "--host-bandwidth-gbps",
            "200",
            "-o",
            paths["cluster"],
        )[0]
        == 0
    )
    return paths


def test_simulate_json_contract(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.json"
    status, out, _ = run(
        capsys,
        "simulate",
        files["profile"],
        files["plan"],
        "--cluster",
        files["cluster"],
        "--json",
        "--trace",
        str(trace),
    )
    assert status == 0
    result = json.loads(out)
    for key in ("step_time_ms", "samples_per_s", "bubble_fraction", "fits", "stages"):
        assert key in result
    assert len(result["stages"]) == 4
    for stage in result["stages"]:
        assert {"layers", "busy_ms", "peak_bytes", "fits"} <= set(stage)
    assert sum(len(stage["layers"]) for stage in result["stages"]) == 177
    bubble = 1 - sum(s["busy_ms"] for s in result["stages"]) / (4 * result["step_time_ms"])
    assert result["bubble_fraction"] == pytest.approx(bubble, rel=1e-9)
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} >= {"forward", "backward", "send_activation"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)


def test_simulate_text_summary(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "simulate", files["profile"], files["plan"], "--cluster", files["cluster"]
    )
    assert status == 0
    assert "step time" in out and "bubble" in out
    assert len([line for line in out.splitlines() if line.strip()[:1].isdigit()]) == 4


def test_plan_template_contract(files: dict[str, str]) -> None:
    plan = json.loads(Path(files["plan"]).read_text())
    assert plan["format"] == "pipestudio.plan"
    assert plan["schedule"] == "1f1b" and plan["num_microbatches"] == 8
    assert [len(s["layers"]) for s in plan["stages"]] == [45, 44, 44, 44]
    assert set(plan["policies"].values()) == {"keep"}


def test_cluster_template_contract(files: dict[str, str]) -> None:
    cluster = json.loads(Path(files["cluster"]).read_text())
    assert [level["size"] for level in cluster["levels"]] == [2, 2]
    assert [level["bandwidth_gbps"] for level in cluster["levels"]] == [400.0, 100.0]
    assert {device["memory_bytes"] for device in cluster["devices"]} == {16 * 2**30}


def test_import_without_output_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "import-pipedream", str(PIPEDREAM_DIR / "alexnet" / "graph.txt"))
    assert status == 0
    profile = json.loads(out)
    assert profile["microbatch_size"] == 1 and profile["model"] == "alexnet"


@pytest.mark.parametrize("name", ["profile", "cluster", "plan", "simresult"])
def test_schema_command(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "schema", name)
    assert status == 0
    assert json.loads(out)["properties"]["format"]["const"] == f"pipestudio.{name}"


def test_validate_command(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "validate", files["plan"], "--profile", files["profile"])
    assert status == 0 and "valid pipestudio.plan" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            [
                "cluster-template",
                "--devices",
                "4",
                "--bandwidth-gbps",
                "100",
                "--device-memory",
                "lots",
            ],
            "size 'lots' is not understood",
        ),
        (
            ["cluster-template", "--devices", "4,x", "--bandwidth-gbps", "100"],
            "--devices '4,x' must be a comma-separated list of integers",
        ),
        (["import-pipedream", "/nonexistent/graph.txt"], "cannot read /nonexistent/graph.txt"),
        (
            ["import-pipedream", str(PIPEDREAM_DIR / "vgg16" / "graph.txt"), "--batch-size", "0"],
            "--batch-size must be >= 1, got 0",
        ),
    ],
)
def test_errors_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err


def test_bad_documents_exit_2(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = json.loads(Path(files["plan"]).read_text())
    plan["stages"][1]["layers"].append(plan["stages"][0]["layers"][0])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(plan))
    status, _, err = run(capsys, "simulate", files["profile"], str(bad))
    assert status == 2 and "overlapping stages" in err
    plan["num_microbatches"] = -1
    bad.write_text(json.dumps(plan))
    status, _, err = run(capsys, "simulate", files["profile"], str(bad))
    assert status == 2 and "num_microbatches = -1" in err
    bad.write_text("{not json")
    status, _, err = run(capsys, "simulate", files["profile"], str(bad))
    assert status == 2 and str(bad) in err


def test_console_script_help() -> None:
    exe = Path(sys.executable).parent / "pipestudio"
    assert exe.exists(), "the pipestudio console script is installed beside python"
    completed = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True)
    for command in ("import-pipedream", "plan-template", "cluster-template", "simulate", "schema"):
        assert command in completed.stdout


@pytest.fixture
def vgg16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    path = str(tmp_path / "vgg16.json")
    assert (
        run(
            capsys,
            "import-pipedream",
            str(PIPEDREAM_DIR / "vgg16" / "graph.txt"),
            "--batch-size",
            "64",
            "-o",
            path,
        )[0]
        == 0
    )
    return path


def test_max_batch_json_contract(vgg16: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        "max-batch",
        vgg16,
        "--algorithm",
        "optimal",
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--schedule",
        "1f1b",
        "--device-memory",
        "4GiB",
        "--json",
    )
    assert status == 0
    answer = json.loads(out)
    assert {"microbatch_size", "global_batch", "plan", "result", "limit_reached", "trace"} <= set(
        answer
    )
    size = answer["microbatch_size"]
    assert size >= 1 and answer["global_batch"] == 8 * size and not answer["limit_reached"]
    assert answer["plan"]["microbatch_size"] == size and answer["result"]["fits"]
    assert answer["result"]["timeline"], "--json carries the full simulation"
    fits = {entry["microbatch_size"]: entry["fits"] for entry in answer["trace"]}
    assert fits[size] and not fits[size + 1]


def test_max_batch_text_and_refusal(vgg16: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "max-batch",
        vgg16,
        "--algorithm",
        "dawnpiper",
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--schedule",
        "gpipe",
    ]
    status, out, _ = run(capsys, *argv, "--device-memory", "4GiB")
    assert status == 0
    assert "the largest micro-batch that fits 4.00 GiB per device is" in out
    assert "global batch" in out and "samples do not fit" in out
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert err == (
        "error: max-batch needs a device memory: --device-memory or a cluster with memory_bytes\n"
    )


@pytest.mark.parametrize("algorithm", ["optimal", "vpipe", "dawnpiper"])
def test_infeasible_plan_names_the_smallest_memory(
    algorithm: str, vgg16: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "plan",
        vgg16,
        "--algorithm",
        algorithm,
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--schedule",
        "1f1b",
        "--json",
        "--device-memory",
    ]
    status, out, err = run(capsys, *argv, "4GiB")
    assert status == 2 and out == ""
    assert err.startswith(f"error: {algorithm}: ") and err.count("\n") == 1
    match = re.search(
        r"the smallest device memory that fits is [0-9.]+ GiB \(([0-9]+) bytes\) "
        r"per device, against 4\.00 GiB given",
        err,
    )
    assert match, err
    status, out, _ = run(capsys, *argv, match.group(1))
    assert status == 0 and json.loads(out)["result"]["fits"]


def test_compare_rows_carry_the_smallest_memory(
    vgg16: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(
        capsys,
        "compare",
        vgg16,
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--schedule",
        "1f1b",
        "--device-memory",
        "4GiB",
        "--json",
    )
    assert status == 0
    rows = {row["algorithm"]: row for row in json.loads(out)["rows"]}
    assert rows["optimal"]["plan"] is None
    assert rows["optimal"]["min_memory_bytes"] > 4 * 2**30
    assert str(rows["optimal"]["min_memory_bytes"]) in rows["optimal"]["error"]
    assert rows["uniform"]["min_memory_bytes"] is None  # a plan, though it does not fit


def test_a_precision_other_than_the_profiles_exits_2_naming_both(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The profile's times hold for the arithmetic it was measured in: planning or
    simulating in another is refused, with one line naming both precisions."""
    bf16 = tmp_path / "bf16.json"
    document = json.loads(Path(files["profile"]).read_text())
    bf16.write_text(json.dumps({**document, "precision": "bf16"}))
    wanted = "asks for precision 'fp32' but the profile was measured in 'bf16'"
    for argv in (
        [
            "plan-template",
            str(bf16),
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            "1f1b",
            "--precision",
            "fp32",
        ],
        [
            "plan",
            str(bf16),
            "--algorithm",
            "uniform",
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            "gpipe",
            "--precision",
            "fp32",
        ],
        [
            "compare",
            str(bf16),
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            "gpipe",
            "--precision",
            "fp32",
        ],
        ["simulate", str(bf16), files["plan"]],
    ):
        status, _, err = run(capsys, *argv)
        assert status == 2 and wanted in err and len(err.splitlines()) == 1, (argv, err)
    status, out, _ = run(
        capsys,
        "plan-template",
        str(bf16),
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--schedule",
        "1f1b",
    )
    assert status == 0 and json.loads(out)["precision"] == "bf16"  # the profile's
    assert (
        run(
            capsys,
            "plan",
            files["profile"],
            "--algorithm",
            "uniform",
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            "gpipe",
            "--precision",
            "bf16",
        )[0]
        == 2
    )


def test_simulate_prints_model_flops_and_utilisation(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counted = tmp_path / "counted.json"
    document = json.loads(Path(files["profile"]).read_text())
    for layer in document["layers"]:
        layer.update(fwd_flops=10**9, bwd_flops=2 * 10**9)
    counted.write_text(json.dumps(document))
    status, out, _ = run(capsys, "simulate", str(counted), files["plan"], "--peak-tflops", "1")
    assert status == 0 and "GFLOP/step" in out and "(MFU " in out
    status, out, _ = run(
        capsys,
        "simulate",
        str(counted),
        files["plan"],
        "--json",
        "--no-timeline",
        "--peak-tflops",
        "2",
    )
    result = json.loads(out)
    assert result["mfu"] == pytest.approx(result["model_tflops"] / (4 * 2))
    status, _, err = run(capsys, "simulate", str(counted), files["plan"], "--peak-tflops", "0")
    assert status == 2 and "--peak-tflops must be > 0, got 0.0" in err


def test_interleaved_and_zero_bubble_plans_are_made_from_templates_and_simulated(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On resnet50's profile (4 devices, 8 micro-batches, the cluster of the fixture): both
    schedules predict a shorter step than 1F1B on the same devices; the planners refuse
    them by name (they plan gpipe, 1f1b and pipedream)."""
    steps = {}
    for schedule, extra in (
        ("1f1b", []),
        ("interleaved-1f1b", ["--virtual-stages", "2"]),
        ("zero-bubble", []),
    ):
        plan = str(tmp_path / f"{schedule}.json")
        status, _, err = run(
            capsys, "plan-template", files["profile"], "--stages", "4", "--microbatches", "8",
            "--schedule", schedule, *extra, "-o", plan,
        )  # fmt: skip
        assert status == 0, err
        status, out, err = run(
            capsys, "simulate", files["profile"], plan, "--cluster", files["cluster"], "--json",
            "--no-timeline",
        )  # fmt: skip
        assert status == 0, err
        steps[schedule] = json.loads(out)["step_time_ms"]
    document = json.loads(Path(tmp_path / "interleaved-1f1b.json").read_text())
    assert len(document["stages"]) == 8 and document["virtual_stages"] == 2
    assert steps["interleaved-1f1b"] < steps["1f1b"] and steps["zero-bubble"] < steps["1f1b"]
    status, _, err = run(
        capsys, "plan-template", files["profile"], "--stages", "4", "--microbatches", "6",
        "--schedule", "interleaved-1f1b", "--virtual-stages", "2",
    )  # fmt: skip
    assert status == 2 and "needs num_microbatches a multiple of 4" in err, err
    with pytest.raises(SystemExit) as refused:
        main(["plan", files["profile"], "--algorithm", "balance-time", "--stages", "4",
              "--microbatches", "8", "--schedule", "zero-bubble"])  # fmt: skip
    assert refused.value.code == 2
    assert "invalid choice: 'zero-bubble'" in capsys.readouterr().err
