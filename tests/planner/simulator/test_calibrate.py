"""Calibration against runs whose truth is known: the simulator's own timeline of a profile
that differs from the one calibrated by known factors and link speeds."""

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from pipestudio.cli import main
from pipestudio.cli.calibrate import format_report
from pipestudio.planner import Profile, cluster_template, plan_template, simulate
from pipestudio.planner.algorithms.schedules import derived
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.simulator.calibrate import (
    CalibrationError,
    Sharing,
    calibrate,
    measured_step_times,
    op_events,
    read_events,
    report,
)
from pipestudio.planner.simulator.placement import Host, shared_placement, started_hosts


def profile(rng: random.Random, num_layers: int) -> Profile:
    layers = [
        {
            "name": f"l{i}",
            "fwd_ms": rng.uniform(0.5, 3),
            "bwd_ms": rng.uniform(1, 6),
            "param_bytes": rng.randrange(1, 10**6),
            "saved_bytes": rng.randrange(1, 10**6),
            "output_bytes": rng.randrange(10**4, 10**6),
            "update_ms": rng.uniform(0.1, 1),
        }
        for i in range(num_layers)
    ]
    return Profile.model_validate(
        {"model": "m", "microbatch_size": 2, "input_bytes": 5000, "layers": layers}
    )


def truth(base: Profile, plan: Plan, factors: list[tuple[float, float, float]]) -> Profile:
    """``base`` with each stage's forward, backward and update scaled by its factors."""
    stage_of = {name: idx for idx, stage in enumerate(plan.stages) for name in stage.layers}
    return base.model_copy(
        update={
            "layers": [
                layer.model_copy(
                    update={
                        "fwd_ms": layer.fwd_ms * factors[stage_of[layer.name]][0],
                        "bwd_ms": layer.bwd_ms * factors[stage_of[layer.name]][1],
                        "update_ms": layer.update_ms * factors[stage_of[layer.name]][2],
                    }
                )
                for layer in base.layers
            ]
        }
    )


def engine_events(
    profile: Profile, plan: Plan, cluster: Any, steps: int, recompute_spans: bool = True
) -> list[dict]:
    """The simulator's timeline as the engine reports ops: a recompute inside the backward
    that follows it (and, with ``recompute_spans``, reported as a span of its own too)."""
    timeline = simulate(profile, plan, cluster, num_steps=steps).timeline
    assert timeline is not None
    ops = sorted((op.model_dump() for op in timeline), key=lambda op: op["start_ms"])
    pending: dict[tuple, float] = {}
    events = []
    for op in ops:
        key = (op["stage"], op["replica"], op["microbatch"], op["step"])
        if op["op"] == "recompute":
            pending[key] = op["start_ms"]
            if recompute_spans:
                events.append({"type": "op", **op})
            continue
        if op["op"] == "backward" and key in pending:
            op["start_ms"] = pending.pop(key)
        events.append({"type": "op", **op})
    return events


@pytest.mark.parametrize(
    ("schedule", "spans"),
    [("gpipe", True), ("1f1b", True), ("1f1b", False), ("zero-bubble", True)],
)
def test_calibration_recovers_known_factors_and_links(schedule: str, spans: bool) -> None:
    rng = random.Random(7)
    for _ in range(20):
        base = profile(rng, rng.randint(4, 10))
        num_stages = rng.randint(2, 4)
        plan = plan_template(base, num_stages, rng.choice([2, 4, 8]), schedule)
        plan = plan.model_copy(
            update={
                "policies": {
                    layer.name: rng.choice(["keep", "keep", "recompute"]) for layer in base.layers
                }
            }
        )
        factors = [
            (rng.uniform(0.5, 3), rng.uniform(0.5, 3), rng.uniform(0.5, 3))
            for _ in range(num_stages)
        ]
        link = rng.choice([1.0, 10.0])
        real_cluster = cluster_template([num_stages], [link])
        real = truth(base, plan, factors)
        events = engine_events(real, plan, real_cluster, steps=3, recompute_spans=spans)
        assumed = cluster_template([num_stages], [100.0])  # what the user thought
        calibration = calibrate(base, plan, events, assumed)
        for stage, (f, b, u) in zip(calibration.stages, factors, strict=True):
            assert stage.factors["forward"] == pytest.approx(f, rel=1e-9)
            assert stage.factors["backward"] == pytest.approx(b, rel=1e-9)
            assert stage.factors["update"] == pytest.approx(u, rel=1e-9)
        # zero-bubble simulates a step before the three (``budget.padding_steps``)
        last = 3 if schedule == "zero-bubble" else 2
        assert calibration.steps == list(range(1, last + 1))
        expected = simulate(real, plan, real_cluster, with_timeline=False).step_time_ms
        before = simulate(base, plan, assumed, with_timeline=False).step_time_ms
        after = simulate(
            calibration.profile, plan, calibration.cluster, with_timeline=False
        ).step_time_ms
        # the links: an idle receiver's wait is the transfer, so the bandwidth is exact
        # when one was ever idle (nearly always); compute factors are exact regardless
        if 0 in calibration.link_gbps:
            assert calibration.link_gbps[0] == pytest.approx(link, rel=1e-6)
            assert after == pytest.approx(expected, rel=1e-6)
        assert not math.isclose(before, expected, rel_tol=0.05)
        compared = report(calibration, base, plan, assumed, events)
        for stage in compared["stage_busy_ms"]:  # recomputes counted once, on both sides
            assert stage["calibrated_error"] == pytest.approx(0.0, abs=1e-9)
        measured = measured_step_times(op_events(events))
        assert list(measured) == list(range(1, last + 1))
        assert measured[last] == pytest.approx(expected, rel=1e-6)


def test_the_time_between_ops_is_found_and_counted() -> None:
    """A run whose workers spend 0.3 ms before each forward and backward that the simulator
    does not know of (the truth's ops, started 0.3 ms late): calibration finds the 0.3 ms
    in the gaps no wait can hide in and predicts the run's step."""
    rng = random.Random(13)
    base = profile(rng, 6)
    plan = plan_template(base, 3, 8, "1f1b")
    real = truth(base, plan, [(1.5, 1.2, 1.0), (1.0, 1.0, 1.0), (2.0, 1.5, 1.0)])
    events = engine_events(real, plan, None, steps=3)
    for event in events:
        if event["op"] in ("forward", "backward"):
            event["start_ms"] += 0.3
    calibration = calibrate(base, plan, events)
    assert calibration.stages[0].measured["overhead"] == pytest.approx(0.3)
    compared = report(calibration, base, plan, None, events)
    assert compared["step_ms"]["calibrated_error"] == pytest.approx(0.0, abs=1e-9)
    expected = simulate(real, plan, None, with_timeline=False).step_time_ms
    assert compared["step_ms"]["measured"] == pytest.approx(expected)


@pytest.mark.parametrize("schedule", ["1f1b", "zero-bubble"])
def test_the_time_between_ops_is_paid_per_op_by_the_schedules_predicted(schedule: str) -> None:
    """A run of a machine whose engine spends c between any two ops (the truth's
    ``op_overhead_ms``; each op event starts c after the op before it could): calibrated
    on one schedule, the profile carries c apart from the stages' factors, so it predicts
    the schedules with more, shorter ops (zero-bubble's split backward, interleaved's
    chunks) as the truth runs them. Folded into per-stage factors, c would be paid once per
    stage's forward and backward whatever the schedule."""
    rng = random.Random(17)
    for _ in range(6):
        base = profile(rng, 8)
        plan = plan_template(base, 2, 4, schedule)
        overhead = rng.uniform(0.2, 1.0)
        real = truth(base, plan, [(1.5, 1.2, 1.0), (0.8, 1.4, 1.0)])
        real = real.model_copy(update={"op_overhead_ms": overhead})
        events = engine_events(real, plan, None, steps=3)
        for event in events:
            if event["op"] in ("forward", "backward", "weight"):
                event["start_ms"] += overhead  # the op proper; the overhead came before it
        calibration = calibrate(base, plan, events)
        assert calibration.profile.op_overhead_ms == pytest.approx(overhead)
        assert calibration.summary()["op_overhead_ms"] == pytest.approx(overhead)
        assert calibration.stages[1].factors["forward"] == pytest.approx(0.8)
        assert calibration.stages[1].factors["backward"] == pytest.approx(1.4)
        chunked = plan_template(base, 4, 4, "1f1b")
        for other in (
            plan_template(base, 2, 4, "1f1b"),
            plan_template(base, 2, 4, "zero-bubble"),
            derived(chunked, "interleaved-1f1b", 2),
        ):
            expected = simulate(real, other, None, with_timeline=False).step_time_ms
            predicted = simulate(calibration.profile, other, None, with_timeline=False)
            assert predicted.step_time_ms == pytest.approx(expected, rel=1e-9), other.schedule
        compared = report(calibration, base, plan, None, events)
        assert compared["step_ms"]["calibrated_error"] == pytest.approx(0.0, abs=1e-9)
        for stage in compared["stage_busy_ms"]:
            assert stage["calibrated_error"] == pytest.approx(0.0, abs=1e-9)
        assert f"between two ops the engine spent {overhead:.3f} ms" in format_report(compared)
        again = calibrate(calibration.profile, plan, events)  # from a calibrated profile
        assert again.profile.op_overhead_ms == pytest.approx(overhead)
        assert again.stages[0].factors["forward"] == pytest.approx(1.0)
        assert again.stages[0].factors["backward"] == pytest.approx(1.0)


def test_a_profile_of_a_far_larger_model_is_calibrated_as_faithfully() -> None:
    """A run of a small model planned on the profile of a large one (the built-in gpt24
    profile and a width-32 gpt): forward and backward a hundredth of the profile's. The
    factors come back as they are, and the calibrated stages and step are the measured ones
    (a floor of 0.05 on the backward's factor once made them 3 times too slow)."""
    rng = random.Random(21)
    base = profile(rng, 8)
    plan = plan_template(base, 2, 4, "1f1b")
    factors = [(0.019, 0.0147, 0.3), (0.028, 0.021, 0.47)]
    events = engine_events(truth(base, plan, factors), plan, None, steps=3)
    calibration = calibrate(base, plan, events)
    for stage, (f, b, u) in zip(calibration.stages, factors, strict=True):
        assert stage.factors["forward"] == pytest.approx(f, rel=1e-9)
        assert stage.factors["backward"] == pytest.approx(b, rel=1e-9)
        assert stage.factors["update"] == pytest.approx(u, rel=1e-9)
    compared = report(calibration, base, plan, None, events)
    assert compared["step_ms"]["calibrated_error"] == pytest.approx(0.0, abs=1e-9)
    for stage in compared["stage_busy_ms"]:
        assert stage["calibrated_error"] == pytest.approx(0.0, abs=1e-9)


def test_links_are_calibrated_for_the_bytes_the_profile_moves() -> None:
    """The same run, its tensors 64 times smaller than the profile's (a small model on a
    large model's profile): each send counts the bytes the simulator moves for it, so the
    calibrated links reproduce the run's transfers and step; counted at the run's bytes,
    they came out 64 times slower and the step far too slow."""
    rng = random.Random(8)
    base = profile(rng, 6)
    plan = plan_template(base, 3, 4, "1f1b")
    real_cluster = cluster_template([3], [1.0])
    events = engine_events(base, plan, real_cluster, steps=3)
    for event in events:
        if event["op"].startswith("send_"):
            event["bytes"] //= 64
    calibration = calibrate(base, plan, events, cluster_template([3], [100.0]))
    assert calibration.link_gbps[0] == pytest.approx(1.0, rel=1e-6)
    compared = report(calibration, base, plan, cluster_template([3], [100.0]), events)
    assert compared["step_ms"]["calibrated_error"] == pytest.approx(0.0, abs=1e-6)


def test_a_recompute_predicted_longer_than_the_measured_backward_leaves_it_a_share() -> None:
    """The backward proper is what the measured backward leaves after the recompute, at
    least ``_MIN_BACKWARD_SHARE`` of it, never zero or less."""
    base = profile(random.Random(4), 4)
    plan = plan_template(base, 2, 4, "1f1b")
    plan = plan.model_copy(update={"policies": {layer.name: "recompute" for layer in base.layers}})
    events = engine_events(base, plan, None, steps=3, recompute_spans=False)
    for event in events:  # backwards that measured less than the recompute alone should take
        if event["op"] == "backward":
            event["start_ms"] = event["end_ms"] - 0.01
    calibration = calibrate(base, plan, events)
    for stage in calibration.stages:
        assert stage.factors["backward"] > 0
        proper = stage.factors["backward"] * (
            stage.predicted["backward"] - stage.predicted.get("recompute", 0.0)
        )
        assert proper == pytest.approx(0.05 * stage.measured["backward"])


def test_an_update_the_profile_lacks_is_shared_by_parameter_bytes() -> None:
    base = profile(random.Random(3), 4)
    base = base.model_copy(
        update={"layers": [layer.model_copy(update={"update_ms": 0.0}) for layer in base.layers]}
    )
    plan = plan_template(base, 2, 4, "1f1b")
    events = engine_events(base, plan, None, steps=2)
    for event in events:
        if event["op"] == "backward" and event["microbatch"] % 4 == 3:
            events.append(
                {
                    "type": "op",
                    "stage": event["stage"],
                    "replica": 0,
                    "op": "update",
                    "microbatch": None,
                    "step": event["step"],
                    "start_ms": event["end_ms"],
                    "end_ms": event["end_ms"] + 3.0,
                }
            )
    calibration = calibrate(base, plan, events)
    stage0 = [layer for layer in calibration.profile.layers if layer.name in plan.stages[0].layers]
    assert sum(layer.update_ms for layer in stage0) == pytest.approx(3.0)
    total = sum(layer.param_bytes for layer in stage0)
    assert stage0[0].update_ms == pytest.approx(3.0 * stage0[0].param_bytes / total)


def test_bad_measurements_are_refused_by_name() -> None:
    base = profile(random.Random(5), 4)
    plan = plan_template(base, 2, 4, "1f1b")
    with pytest.raises(CalibrationError, match="no op events"):
        calibrate(base, plan, [{"type": "summary"}])
    three = plan_template(base, 3, 4, "1f1b")
    with pytest.raises(CalibrationError, match="the measurements have 3 stages, the plan 2"):
        calibrate(base, plan, engine_events(base, three, None, steps=2))
    events = engine_events(base, plan, None, steps=3)
    made_up = {
        "type": "op",
        "stage": 0,
        "replica": 0,
        "op": "forward\x00",
        "step": 2,
        "microbatch": 0,
        "start_ms": 0.0,
        "end_ms": 1e12,
    }
    assert op_events([*events, made_up]) == op_events(events)  # no such op: left out
    with pytest.raises(CalibrationError, match=r"m\.jsonl line 2: not JSON"):
        read_events(['{"type": "start"}', "{oops"], "m.jsonl")
    with pytest.raises(CalibrationError, match="line 1: an op event needs"):
        read_events(
            [
                json.dumps(
                    {
                        "type": "op",
                        "stage": -1,
                        "replica": 0,
                        "op": "forward",
                        "step": 0,
                        "start_ms": 0,
                        "end_ms": 1,
                    }
                )
            ],
            "m.jsonl",
        )


def test_cli_writes_a_profile_that_simulate_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = profile(random.Random(9), 6)
    plan = plan_template(base, 3, 4, "gpipe")
    real = truth(base, plan, [(2.0, 1.0, 1.0), (1.0, 1.5, 1.0), (1.0, 1.0, 3.0)])
    files = {name: tmp_path / name for name in ("p.json", "plan.json", "m.jsonl", "c.json")}
    files["p.json"].write_text(base.to_json())
    files["plan.json"].write_text(plan.to_json())
    files["m.jsonl"].write_text(
        "\n".join(json.dumps(e) for e in engine_events(real, plan, None, steps=4))
    )
    out = tmp_path / "calibrated.json"
    assert (
        main(
            [
                "calibrate",
                str(files["p.json"]),
                str(files["m.jsonl"]),
                "--plan",
                str(files["plan.json"]),
                "--steps",
                "1:4",
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    step = report["step_ms"]
    assert step["calibrated"] == pytest.approx(step["measured"], rel=1e-6)
    assert abs(step["predicted"] / step["measured"] - 1) > 0.05
    assert main(["simulate", str(out), str(files["plan.json"]), "--json", "--no-timeline"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert simulated["step_time_ms"] == pytest.approx(step["measured"], rel=1e-6)
    files["m.jsonl"].write_text('{"type": "op", "stage": 0}\n')
    assert (
        main(
            [
                "calibrate",
                str(files["p.json"]),
                str(files["m.jsonl"]),
                "--plan",
                str(files["plan.json"]),
            ]
        )
        == 2
    )
    assert "line 1: an op event needs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "calibrate",
                str(files["p.json"]),
                str(files["m.jsonl"]),
                "--plan",
                str(files["plan.json"]),
                "--steps",
                "5:2",
            ]
        )
    assert exited.value.code == 2
    assert "'5:2': expected A:B with 0 <= A < B" in capsys.readouterr().err


def test_cli_takes_the_plan_the_metrics_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --plan the run's own plan (its metrics' ``plan`` event) is calibrated, over
    the steps before it first migrated layers; steps past that need the new plan."""
    base = profile(random.Random(9), 6)
    plan = plan_template(base, 3, 4, "gpipe")
    real = truth(base, plan, [(2.0, 1.0, 1.0), (1.0, 1.5, 1.0), (1.0, 1.0, 3.0)])
    events = engine_events(real, plan, None, steps=6)
    metrics, source = tmp_path / "m.jsonl", tmp_path / "p.json"
    source.write_text(base.to_json())

    def calibrated(lines: list[dict], *extra: str) -> int:
        metrics.write_text("\n".join(json.dumps(e) for e in lines))
        return main(["calibrate", str(source), str(metrics), "--json", *extra])

    assert calibrated(events) == 2
    assert "m.jsonl names no plan" in capsys.readouterr().err
    header = {"type": "plan", "plan": json.loads(plan.to_json())}
    assert calibrated([header, *events]) == 0
    step = json.loads(capsys.readouterr().err)["step_ms"]
    assert step["calibrated"] == pytest.approx(step["measured"], rel=1e-6)
    migration = {"type": "migration", "phase": "done", "step": 4, "stage": 0}
    assert calibrated([header, *events, migration]) == 0
    assert json.loads(capsys.readouterr().err)["steps"] == [1, 3]
    assert calibrated([header, *events, migration], "--steps", "2:6") == 2
    assert (
        "--steps 2:6: the run migrated layers at step 4, so its metrics' plan held until step 3"
    ) in capsys.readouterr().err
    broken = {"type": "plan", "plan": {"stages": "x"}}
    assert calibrated([broken, *events]) == 2
    assert "the run's plan is not a valid plan" in capsys.readouterr().err


def test_a_run_on_shared_cores_is_predicted_sharing_them() -> None:
    """Four ranks on two cores: the prediction from the profile runs two stages per core,
    one op at a time; the calibrated one gives each stage its device, the measured op
    times holding what sharing cost."""
    base = profile(random.Random(17), 8)
    plan = plan_template(base, 4, 4, "1f1b")
    sharing = Sharing([Host("h", cores=2, threads=1)], [[0]] * 4)
    placed = shared_placement(plan, None, sharing.hosts, sharing.host_of)
    assert placed is not None
    events = engine_events(base, *placed, steps=3)
    calibration = calibrate(base, plan, events, None, sharing=sharing)
    compared = report(calibration, base, plan, None, events)
    assert compared["shared_cores"] is True
    assert (
        compared["step_ms"]["predicted"]
        == simulate(base, *placed, with_timeline=False).step_time_ms
    )
    assert (
        compared["step_ms"]["calibrated"]
        == simulate(
            calibration.profile, plan, calibration.cluster, with_timeline=False
        ).step_time_ms
    )
    assert compared["step_ms"]["predicted_error"] == pytest.approx(0.0, abs=1e-9)
    unshared = report(calibrate(base, plan, events), base, plan, None, events)
    assert unshared["shared_cores"] is False
    assert unshared["step_ms"]["predicted_error"] > 0.2


def test_cli_predicts_ranks_that_shared_a_gpu_as_sharing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's start events say stages 0 and 1 ran on cuda:0 of one host: the CLI's
    prediction from the profile puts them on one device (the run was simulated so), and
    a run whose ranks each had a GPU is predicted as the plan places it."""
    base = profile(random.Random(23), 6)
    plan = plan_template(base, 3, 4, "1f1b")
    cluster = cluster_template([3], [100.0], host_bandwidth_gbps=50.0)
    devices = ["cuda:0", "cuda:0", "cuda:1"]
    starts = [
        {
            "type": "start",
            "rank": s,
            "stage": s,
            "replica": 0,
            "host": "gpu-box",
            "device": devices[s],
            "threads": 1,
        }
        for s in range(3)
    ]
    placed = shared_placement(plan, cluster, *started_hosts(plan, starts) or ([], []))
    assert placed is not None
    events = engine_events(base, *placed, steps=3)
    paths = {name: tmp_path / name for name in ("p.json", "c.json", "m.jsonl")}
    paths["p.json"].write_text(base.to_json())
    paths["c.json"].write_text(cluster.to_json())
    header = {"type": "plan", "plan": json.loads(plan.to_json())}

    def predicted(lines: list[dict]) -> dict:
        paths["m.jsonl"].write_text("\n".join(json.dumps(e) for e in lines))
        assert (
            main(
                [
                    "calibrate",
                    str(paths["p.json"]),
                    str(paths["m.jsonl"]),
                    "--cluster",
                    str(paths["c.json"]),
                    "--json",
                ]
            )
            == 0
        )
        return json.loads(capsys.readouterr().err)

    shared = predicted([header, *starts, *events])
    assert shared["shared_cores"] is True
    assert shared["step_ms"]["predicted_error"] == pytest.approx(0.0, abs=1e-9)
    apart = predicted([header, *[{**s, "device": f"cuda:{s['stage']}"} for s in starts], *events])
    assert apart["shared_cores"] is False and apart["step_ms"]["predicted_error"] > 0.2


def test_waits_for_a_core_are_calibrated_on_a_host_with_more_ranks_than_cores() -> None:
    """Four ranks on two cores wait for a core between ops, which no op event holds: the
    calibrated compute grows until the calibrated step is the measured one, and a
    receiver's wait is not taken for a slow link; a run with a core per rank is left as
    its ops say."""
    base = profile(random.Random(17), 8)
    plan = plan_template(base, 4, 4, "1f1b")
    sharing = Sharing([Host("h", cores=2, threads=1)], [[0]] * 4)
    placed = shared_placement(plan, None, sharing.hosts, sharing.host_of)
    assert placed is not None
    events = engine_events(base, *placed, steps=4)
    calibration = calibrate(base, plan, events, None, sharing=sharing)
    compared = report(calibration, base, plan, None, events)
    assert calibration.core_wait > 1.1
    assert compared["step_ms"]["calibrated_error"] == pytest.approx(0.0, abs=2e-3)
    assert calibration.summary()["core_wait"] == calibration.core_wait
    assert calibration.link_gbps == {}
    # not knowing where the ranks ran, the waits pass for slow links: a quarter off
    alone = calibrate(base, plan, events, None)
    assert alone.core_wait == 1.0 and alone.link_gbps
    assert report(alone, base, plan, None, events)["step_ms"]["calibrated_error"] < -0.2
    # four cores: no waits, nothing added
    roomy = Sharing([Host("h", cores=4, threads=1)], [[0]] * 4)
    own = engine_events(base, plan, None, steps=4)
    assert calibrate(base, plan, own, None, sharing=roomy).core_wait == 1.0
