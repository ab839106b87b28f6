"""GET /api/runs/{id}/calibrated-profile: a run's profile made to match its measured ops."""

from fastapi.testclient import TestClient

from pipestudio.planner import Plan, Profile
from tests.backend.conftest import ANONYMOUS, AUTH, add_profile, small_profile
from tests.backend.test_sockets import Workers, _start
from tests.planner.test_calibrate import engine_events, truth


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
    profile = Profile.model_validate(small_profile())
    real = truth(profile, plan, [(2.0, 1.5, 1.0), (1.0, 3.0, 2.0)])
    events = engine_events(real, plan, None, steps=4)
    for worker, stage in zip(workers, (0, 1), strict=True):
        mine = [e for e in events if e["stage"] == stage]
        worker.expect_ack(worker.send({"type": "events", "run_id": run_id, "events": mine}))

    answer = client.get(url, headers=AUTH, params={"window": 2})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["steps"] == [2, 3]  # the latest two steps
    factors = [stage["factors"] for stage in body["stages"]]
    assert [round(f["forward"], 9) for f in factors] == [2.0, 1.0]
    assert [round(f["backward"], 9) for f in factors] == [1.5, 3.0]
    step = body["step_ms"]
    assert abs(step["calibrated_error"]) < 1e-6 < abs(step["predicted_error"])
    assert all(abs(s["calibrated_error"]) < 1e-6 for s in body["stage_busy_ms"])
    calibrated = Profile.model_validate(body["profile"])
    assert calibrated.layers[0].fwd_ms == 2.0 * profile.layers[0].fwd_ms

    assert client.get(url, headers=AUTH, params={"window": 0}).status_code == 422
    assert client.get(url, headers=ANONYMOUS).status_code == 401
    assert client.get("/api/runs/999/calibrated-profile", headers=AUTH).status_code == 404


def test_measurements_of_another_plan_are_refused_by_name(client: TestClient,
                                                          fake: Workers) -> None:
    """A worker that reports ops of a third stage of a two-stage plan gets a 409 naming the
    mismatch, never a 500."""
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    bogus = [{"type": "op", "stage": 2, "replica": 0, "op": "forward", "microbatch": 0,
              "step": step, "start_ms": float(step), "end_ms": step + 0.5}
             for step in range(3)]
    workers[0].expect_ack(workers[0].send({"type": "events", "run_id": run_id,
                                           "events": bogus}))
    answer = client.get(f"/api/runs/{run_id}/calibrated-profile", headers=AUTH)
    assert answer.status_code == 409
    assert "the measurements have 3 stages, the plan 2" in answer.json()["detail"]
    add_profile(client)  # the store still answers
