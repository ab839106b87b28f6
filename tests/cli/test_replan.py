"""``pipestudio replan``: the summary, the Proposal JSON, exit codes, ``schema proposal``."""

import json
from pathlib import Path

import pytest

from pipestudio.cli import main
from pipestudio.planner import cluster_template, load_document
from pipestudio.planner.formats.proposal import Proposal
from pipestudio.planner.formats.schemas import json_schema
from tests.planner.helpers import chain_profile, even_plan


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """The hand case of tests/planner/replan/test_replan.py: layer 0 of 4 takes 3x as long."""
    profile = chain_profile(4, output_bytes=0, input_bytes=0)
    observed = profile.model_copy(
        update={
            "layers": [
                profile.layers[0].model_copy(update={"fwd_ms": 3.0, "bwd_ms": 6.0}),
                *profile.layers[1:],
            ]
        }
    )
    paths = {name: str(tmp_path / f"{name}.json") for name in ("plan", "observed", "slow", "other")}
    even_plan(profile, 2, 4, "gpipe").save(paths["plan"])
    observed.save(paths["observed"])
    cluster_template([2], [1e-4]).save(paths["slow"])  # 12.5 bytes/ms
    observed.model_copy(update={"model": "other"}).save(paths["other"])
    return paths


def test_summary_names_the_move_the_gain_and_the_verdict(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "replan", files["plan"], files["observed"])
    assert status == 0
    assert "WORTHWHILE" in out
    assert "step time 54.000 ms -> 45.000 ms" in out and "gain 9.000 ms (16.67%)" in out
    assert "migration 39.06 KiB in 0.000 ms" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("layer")]
    assert rows == [["layer", "from", "stage", "to", "stage"], ["layer1", "0", "1"]]


def test_json_and_output_file_hold_the_proposal(
    files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "out" / "proposal.json"
    status, out, err = run(
        capsys, "replan", files["plan"], files["observed"], "--json", "-o", str(target)
    )
    assert status == 0 and f"wrote {target}" in err
    printed = json.loads(out)
    assert printed["format"] == "pipestudio.proposal" and printed["worthwhile"] is True
    assert printed["moves"] == [{"layer": "layer1", "from_stage": 0, "to_stage": 1}]
    assert load_document(Proposal, target).model_dump(mode="json") == printed
    status, out, _ = run(capsys, "validate", str(target))
    assert status == 0 and "valid pipestudio.proposal version 1" in out


def test_a_move_that_does_not_pay_back_still_exits_zero(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(
        capsys, "replan", files["plan"], files["observed"], "--cluster", files["slow"], "--json"
    )
    assert status == 0
    proposal = json.loads(out)
    assert proposal["worthwhile"] is False and proposal["migration_ms"] == pytest.approx(3200)
    assert "355.6 steps" in proposal["reason"]
    status, out, _ = run(
        capsys,
        "replan",
        files["plan"],
        files["observed"],
        "--cluster",
        files["slow"],
        "--payback-steps",
        "400",
        "--min-gain",
        "0.1",
    )
    assert status == 0 and "WORTHWHILE" in out and "limit 400" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("{plan}", "{other}"),
            "error: the observed profile is of model 'other' but the plan is for 'uniform'",
        ),
        (
            ("{plan}", "{observed}", "--min-gain", "1.5"),
            "error: the minimum gain must be a fraction in [0, 1), got 1.5",
        ),
        (
            ("{plan}", "{observed}", "--payback-steps", "-3"),
            "error: payback steps must be a positive number, got -3.0",
        ),
        (("{plan}", "missing.json"), "error: cannot read missing.json: No such file or directory"),
    ],
)
def test_bad_input_exits_2_with_one_error_line(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    status, out, err = run(capsys, "replan", *(arg.format(**files) for arg in args))
    assert status == 2 and out == ""
    assert err.splitlines() == [message]


def test_schema_proposal_prints_the_published_schema(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "schema", "proposal")
    assert status == 0 and json.loads(out) == json_schema("proposal")
    assert json.loads(out)["$id"] == "urn:pipestudio:schema:proposal:1"
