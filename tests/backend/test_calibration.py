"""GET /api/runs/{id}/calibrated-profile: a run's profile made to match its measured ops."""

from fastapi.testclient import TestClient

from pipestudio.backend.services.calibration import _cpu_cores
from pipestudio.planner import Plan, Profile, simulate
from pipestudio.planner.simulator.placement import Host, shared_placement
from tests.backend.conftest import (
    ANONYMOUS,
    AUTH,
    add_plan,
    add_profile,
    mlp_profile,
)
from tests.backend.test_sockets import Workers, _start
from tests.planner.simulator.test_calibrate import engine_events, truth


def test_a_run_calibrates_its_profile_as_it_goes(client: TestClient, fake: Workers) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    url = f"/api/runs/{run_id}/calibrated-profile"
    waiting = client.get(url, headers=AUTH)
    assert waiting.status_code == 409
    assert "has measured no op yet" in waiting.json()["detail"]

    run = client.get(f"/api/runs/{run_id}", headers=AUTH).json()
    plan_row = client.get(f"/api/plans/{run['plan_id']}", headers=AUTH).json()
    plan = Plan.model_validate(plan_row["document"])
    profile = Profile.model_validate(mlp_profile())
    real = truth(profile, plan, [(2.0, 1.5, 1.0), (1.0, 3.0, 2.0)])
    events = engine_events(real, plan, None, steps=4)
    for worker, stage in zip(workers, (0, 1), strict=True):
        mine = [e for e in events if e["stage"] == stage]
        worker.expect_ack(worker.send({"type": "events", "run_id": run_id, "events": mine}))

    answer = client.get(url, headers=AUTH, params={"window": 2})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["steps"] == [1, 2]  # the latest two but the newest, maybe on its way
    factors = [stage["factors"] for stage in body["stages"]]
    assert [round(f["forward"], 9) for f in factors] == [2.0, 1.0]
    assert [round(f["backward"], 9) for f in factors] == [1.5, 3.0]
    step = body["step_ms"]
    assert abs(step["calibrated_error"]) < 1e-6 < abs(step["predicted_error"])
    assert all(abs(s["calibrated_error"]) < 1e-6 for s in body["stage_busy_ms"])
    calibrated = Profile.model_validate(body["profile"])
    assert calibrated.layers[0].fwd_ms == 2.0 * profile.layers[0].fwd_ms
    # the simulator's ops follow each other with no gap: the engine spent nothing between
    assert body["op_overhead_ms"] == calibrated.op_overhead_ms == 0.0
    assert body["core_wait"] == 1.0

    for hostile in (0, 10**12, "NaN", "1e3"):
        assert client.get(url, headers=AUTH, params={"window": hostile}).status_code == 422
    assert client.get(url, headers=ANONYMOUS).status_code == 401
    assert client.get("/api/runs/999/calibrated-profile", headers=AUTH).status_code == 404


def test_measurements_of_another_plan_are_refused_by_name(
    client: TestClient, fake: Workers
) -> None:
    """A worker that reports ops of a third stage of a two-stage plan gets a 409 naming the
    mismatch, never a 500."""
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    bogus = [
        {
            "type": "op",
            "stage": 2,
            "replica": 0,
            "op": "forward",
            "microbatch": 0,
            "step": step,
            "start_ms": float(step),
            "end_ms": step + 0.5,
        }
        for step in range(3)
    ]
    workers[0].expect_ack(workers[0].send({"type": "events", "run_id": run_id, "events": bogus}))
    answer = client.get(f"/api/runs/{run_id}/calibrated-profile", headers=AUTH)
    assert answer.status_code == 409
    assert "the measurements have 3 stages, the plan 2" in answer.json()["detail"]
    add_profile(client)  # the store still answers


def test_malformed_ops_are_left_out_not_a_500(client: TestClient, fake: Workers) -> None:
    """Ops without times, with bytes that are no count, a stage that is no number or an end
    before their start are left out of the calibration; the well-formed ones still
    calibrate exactly."""
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    run = client.get(f"/api/runs/{run_id}", headers=AUTH).json()
    plan = Plan.model_validate(
        client.get(f"/api/plans/{run['plan_id']}", headers=AUTH).json()["document"]
    )
    profile = Profile.model_validate(mlp_profile())
    events = engine_events(
        truth(profile, plan, [(2.0, 1.0, 1.0), (1.0, 1.0, 1.0)]), plan, None, steps=3
    )
    hostile = [
        {"type": "op", "stage": 0, "replica": 0, "op": "forward", "step": 2},
        {
            "type": "op",
            "stage": 0,
            "replica": 0,
            "op": "send_activation",
            "step": 2,
            "microbatch": 0,
            "start_ms": 1.0,
            "end_ms": 2.0,
            "bytes": "lots",
            "peer_stage": 1,
        },
        {
            "type": "op",
            "stage": "0",
            "replica": 0,
            "op": "forward",
            "step": 2,
            "microbatch": 0,
            "start_ms": 0.0,
            "end_ms": 1e9,
        },
        {
            "type": "op",
            "stage": 0,
            "replica": 0,
            "op": "forward",
            "step": 2,
            "microbatch": 0,
            "start_ms": 5.0,
            "end_ms": 1.0,
        },
        {
            "type": "op",
            "stage": 0,
            "replica": 0,
            "op": "backward",
            "step": 2,
            "microbatch": 0,
            "start_ms": float("nan"),
            "end_ms": float("inf"),
        },
        {
            "type": "op",
            "stage": 0,
            "replica": 0,
            "op": "forward\u0000",
            "step": 2,
            "microbatch": 0,
            "start_ms": 0.0,
            "end_ms": 10**12,
        },
    ]
    for worker, stage in zip(workers, (0, 1), strict=True):
        mine = [e for e in events if e["stage"] == stage]
        worker.expect_ack(worker.send({"type": "events", "run_id": run_id, "events": mine}))
    for event in hostile:  # one message each: what the backend's screening lets through
        workers[0].send({"type": "events", "run_id": run_id, "events": [event]})
    workers[1].expect_ack(workers[1].send({"type": "events", "run_id": run_id, "events": []}))
    answer = client.get(f"/api/runs/{run_id}/calibrated-profile", headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert round(answer.json()["stages"][0]["factors"]["forward"], 9) == 2.0


def test_ranks_that_share_a_host_s_cores_are_predicted_sharing(
    client: TestClient, fake: Workers
) -> None:
    """Four ranks on two 2-slot workers of one 2-core host: the prediction from the profile
    places the stages on the host's two cores (shared_cores), which the plan did not."""
    cpu = [{"kind": "cpu", "index": 0, "cores": 2}]
    workers = [fake("a", slots=2, devices=cpu), fake("b", slots=2, devices=cpu)]
    profile_id = add_profile(client, mlp_profile(3))
    plan_row = add_plan(client, profile_id, [1, 2, 3], approve=True)
    launched = client.post(
        "/api/runs",
        headers=AUTH,
        json={"plan_id": plan_row["id"], "model": "mlp", "model_args": {"layers": "3"}, "steps": 3},
    )
    assert launched.status_code == 201, launched.text
    run_id = launched.json()["id"]
    plan = Plan.model_validate(plan_row["document"])
    profile = Profile.model_validate(mlp_profile(3))
    events = engine_events(profile, plan, None, steps=3)
    for worker, stages in zip(workers, ((0, 1), (2, 3)), strict=True):
        worker.expect("assign")
        mine = [e for e in events if e["stage"] in stages]
        worker.expect_ack(worker.send({"type": "events", "run_id": run_id, "events": mine}))
    body = client.get(f"/api/runs/{run_id}/calibrated-profile", headers=AUTH).json()
    assert body["shared_cores"] is True
    placed = shared_placement(plan, None, [Host("127.0.0.1", 2, 1)], [[0]] * 4)
    assert placed is not None
    expected = simulate(profile, *placed, with_timeline=False).step_time_ms
    assert body["step_ms"]["predicted"] == expected
    assert (
        body["step_ms"]["predicted"]
        > simulate(profile, plan, None, with_timeline=False).step_time_ms
    )


def test_a_worker_s_cores_count_only_when_they_are_a_count() -> None:
    assert _cpu_cores([{"kind": "cpu", "cores": 16}]) == 16
    for devices in ([{"kind": "cpu", "cores": c}] for c in (0, -2, 10**12, True, "2", 2.5)):
        assert _cpu_cores(devices) is None
    assert _cpu_cores([{"kind": "cuda", "cores": 4}]) is None
    assert _cpu_cores("cpu") is None and _cpu_cores([]) is None
