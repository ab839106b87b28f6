"""Proposals that come by themselves (``proposals.auto_propose``): a running job whose
measured step drifts from its plan's prediction gets a repartition proposal without anyone
pressing Propose; none while one waits, none that a person already rejected, none for a
run that runs as predicted."""

import pytest
from fastapi.testclient import TestClient

from pipestudio.backend.context import AppContext
from pipestudio.planner import Plan, Profile, cluster_template
from tests.backend.conftest import AUTH, add_plan, add_profile, mlp_profile
from tests.backend.fakes import FakeWorker
from tests.backend.test_sockets import Workers, _start
from tests.planner.simulator.test_calibrate import engine_events, truth


def _measure(
    client: TestClient,
    workers: list[FakeWorker],
    run_id: int,
    factors: list[tuple[float, float, float]],
) -> None:
    """The run's workers report 6 steps of ops, each stage ``factors`` slower."""
    run = client.get(f"/api/runs/{run_id}", headers=AUTH).json()
    plan = Plan.model_validate(
        client.get(f"/api/plans/{run['plan_id']}", headers=AUTH).json()["document"]
    )
    real = truth(Profile.model_validate(mlp_profile()), plan, factors)
    events = engine_events(real, plan, None, steps=6)
    for worker, stage in zip(workers, (0, 1), strict=True):
        mine = [e for e in events if e["stage"] == stage]
        worker.expect_ack(worker.send({"type": "events", "run_id": run_id, "events": mine}))


def _proposals(client: TestClient) -> list[dict]:  # type: ignore[type-arg]
    return client.get("/api/proposals", headers=AUTH).json()["data"]


def test_a_drifting_run_gets_a_proposal_by_itself(client: TestClient, fake: Workers) -> None:
    context: AppContext = client.app.state.context  # type: ignore[attr-defined]
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    context._auto_propose()
    assert _proposals(client) == []  # nothing measured yet
    _measure(client, workers, run_id, [(1.0, 1.0, 1.0), (4.0, 4.0, 1.0)])
    context._auto_propose()
    [made] = _proposals(client)
    assert (made["run_id"], made["state"], made["created_by"]) == (run_id, "pending", "auto")
    assert made["worthwhile"] and made["document"]["moves"]
    # the step it starts from is the one the Runs page predicts from the same calibration
    calibrated = client.get(f"/api/runs/{run_id}/calibrated-profile", headers=AUTH).json()
    assert made["document"]["step_time_now_ms"] == pytest.approx(
        calibrated["step_ms"]["calibrated"], rel=1e-6
    )
    context._auto_propose()
    assert len(_proposals(client)) == 1  # one waits: no second
    rejected = client.post(f"/api/proposals/{made['id']}/reject", headers=AUTH)
    assert rejected.status_code == 200, rejected.text
    context._auto_propose()
    assert len(_proposals(client)) == 1  # the same moves are not offered again


def test_a_persons_proposal_or_a_stopped_run_gets_none(client: TestClient, fake: Workers) -> None:
    """Racing a person: a proposal someone made, pending or approved and on its way, keeps
    the backend from adding its own; and a run stopped before the check gets none."""
    context: AppContext = client.app.state.context  # type: ignore[attr-defined]
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    _measure(client, workers, run_id, [(1.0, 1.0, 1.0), (4.0, 4.0, 1.0)])
    observed = client.get(f"/api/runs/{run_id}/calibrated-profile", headers=AUTH).json()
    made = client.post(
        "/api/proposals",
        headers=AUTH,
        json={"run_id": run_id, "observed_profile": observed["profile"], "author": "ada"},
    )
    assert made.status_code == 201, made.text
    context._auto_propose()
    assert [p["created_by"] for p in _proposals(client)] == ["ada"]
    approved = client.post(f"/api/proposals/{made.json()['id']}/approve", headers=AUTH, json={})
    assert approved.status_code == 200, approved.text
    context._auto_propose()
    assert len(_proposals(client)) == 1  # approved, not yet applied: still none
    assert client.post(f"/api/runs/{run_id}/stop", headers=AUTH).status_code == 200
    context._auto_propose()
    assert len(_proposals(client)) == 1


def test_a_run_as_predicted_gets_none(client: TestClient, fake: Workers) -> None:
    context: AppContext = client.app.state.context  # type: ignore[attr-defined]
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    _measure(client, workers, run_id, [(1.0, 1.0, 1.0), (1.0, 1.0, 1.0)])
    context._auto_propose()
    assert _proposals(client) == []


def test_a_proposal_weighs_the_links_the_run_measured(client: TestClient, fake: Workers) -> None:
    """The plan's cluster says its link is fast; the run's transfers say it is slow. A
    proposal starts from the step the calibration predicts (the Runs page's number), not
    from the cluster as written."""
    context: AppContext = client.app.state.context  # type: ignore[attr-defined]
    written = cluster_template([2], [100.0])
    cluster_id = client.post(
        "/api/clusters", headers=AUTH, json={"cluster": written.model_dump(mode="json")}
    ).json()["id"]
    plan = add_plan(
        client, add_profile(client, mlp_profile()), [2], approve=True, cluster_id=cluster_id
    )
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers, plan["id"])
    real = truth(
        Profile.model_validate(mlp_profile()),
        Plan.model_validate(plan["document"]),
        [(1.0, 1.0, 1.0), (4.0, 4.0, 1.0)],
    )
    slow = cluster_template([2], [1e-4])  # 100 bytes: 8 ms a transfer
    events = engine_events(real, Plan.model_validate(plan["document"]), slow, steps=6)
    for worker, stage in zip(workers, (0, 1), strict=True):
        mine = [e for e in events if e["stage"] == stage]
        worker.expect_ack(worker.send({"type": "events", "run_id": run_id, "events": mine}))
    calibrated = client.get(f"/api/runs/{run_id}/calibrated-profile", headers=AUTH).json()
    assert calibrated["link_gbps"], calibrated  # the slow link was measured
    context._auto_propose()
    [auto] = _proposals(client)
    assert auto["document"]["step_time_now_ms"] == pytest.approx(
        calibrated["step_ms"]["calibrated"], rel=1e-6
    )
    by_hand = client.post(
        "/api/proposals",
        headers=AUTH,
        json={
            "run_id": run_id,
            "observed_profile": calibrated["profile"],
            "cluster": calibrated["cluster"],
        },
    )
    assert by_hand.status_code == 201, by_hand.text
    assert by_hand.json()["document"]["step_time_now_ms"] == pytest.approx(
        calibrated["step_ms"]["calibrated"], rel=1e-6
    )


def test_a_proposal_starts_from_the_stages_the_run_trains_now(
    client: TestClient, fake: Workers
) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    moved = {
        "type": "migration",
        "phase": "done",
        "migration": 1,
        "step": 2,
        "rank": 0,
        "stage": 0,
        "time_ms": 1.0,
        "moves": [{"layer": "block2", "from_stage": 1, "to_stage": 0}],
    }
    workers[0].expect_ack(workers[0].send({"type": "events", "run_id": run_id, "events": [moved]}))
    stored = client.get(f"/api/runs/{run_id}/events", params={"kind": "migration"}).json()
    assert stored["count"] == 1, stored
    made = client.post(
        "/api/proposals", headers=AUTH, json={"run_id": run_id, "observed_profile": mlp_profile()}
    )
    assert made.status_code == 201, made.text
    stages = [stage["layers"] for stage in made.json()["document"]["current_stages"]]
    assert stages == [["block0", "block1", "block2"], ["block3", "head"]]
