"""The worker protocol and the dashboard stream, driven by scripted workers."""

import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.backend.conftest import AUTH, add_plan, add_profile, mlp_profile
from tests.backend.fakes import FakeWorker

Workers = Callable[..., FakeWorker]


def _launch(client: TestClient, workers: list[FakeWorker], plan_id: int | None = None) -> int:
    """A run of ``mlp`` on ``workers``: of approved plan ``plan_id``, else of a new plan
    cutting it into two stages."""
    if plan_id is None:
        plan_id = add_plan(client, add_profile(client, mlp_profile()), [2], approve=True)["id"]
    response = client.post(
        "/api/runs", headers=AUTH, json={"plan_id": plan_id, "model": "mlp", "steps": 3}
    )
    assert response.status_code == 201, response.text
    run = response.json()
    assert [r["worker_id"] for r in run["ranks"]] == [w.id for w in workers]
    return int(run["id"])


def _start(client: TestClient, workers: list[FakeWorker], plan_id: int | None = None) -> int:
    run_id = _launch(client, workers, plan_id)
    assigns = [w.expect("assign") for w in workers]
    assert [a["open_store"] for a in assigns] == [True, False]
    assert [a["ranks"] for a in assigns] == [
        [{"rank": 0, "stage": 0, "replica": 0}],
        [{"rank": 1, "stage": 1, "replica": 0}],
    ]
    workers[0].send({"type": "store", "run_id": run_id, "host": "127.0.0.1", "port": 4242})
    for worker in workers:
        rendezvous = worker.expect("rendezvous")
        assert (rendezvous["host"], rendezvous["port"]) == ("127.0.0.1", 4242)
        worker.expect_ack(worker.send({"type": "run_state", "run_id": run_id, "state": "running"}))
    return run_id


def _step(stage: int, step: int) -> dict[str, Any]:
    return {
        "type": "step",
        "stage": stage,
        "replica": 0,
        "step": step,
        "start_ms": 10.0 * step,
        "end_ms": 10.0 * step + 5,
        "busy_ms": 4.0,
        "samples_per_s": 100.0,
        "sent_at": time.time(),
    }


def test_ranks_on_one_host_share_its_cores(client: TestClient, fake: Workers) -> None:
    """Each worker is told how many of the run's ranks its host runs, whichever worker runs
    them: two workers on one host and one with two slots on another both say 2, a lone
    rank's host 1 (each rank then takes cores / host_ranks threads)."""
    workers = [
        fake("a", host="10.0.0.5"),
        fake("b", host="10.0.0.5"),
        fake("c", host="10.0.0.6", slots=2),
        fake("d", host="10.0.0.7"),
    ]
    profile_id = add_profile(client, mlp_profile())
    plan = add_plan(client, profile_id, [1, 2, 3, 4], approve=True)
    response = client.post(
        "/api/runs", headers=AUTH, json={"plan_id": plan["id"], "model": "mlp", "steps": 3}
    )
    assert response.status_code == 201, response.text
    assigns = {w.id: w.expect("assign") for w in workers}
    assert {w.id: len(assigns[w.id]["ranks"]) for w in workers} == {
        workers[0].id: 1,
        workers[1].id: 1,
        workers[2].id: 2,
        workers[3].id: 1,
    }
    assert [assigns[w.id]["host_ranks"] for w in workers] == [2, 2, 2, 1]


def test_worker_token_is_required(client: TestClient) -> None:
    bad = {"Authorization": "Bearer no"}
    with (
        client.websocket_connect("/ws/worker", headers=bad) as ws,
        pytest.raises(WebSocketDisconnect) as closed,
    ):
        ws.receive_json()
    assert closed.value.code == 4401


def test_run_streams_to_store_and_dashboard(client: TestClient, fake: Workers) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    with client.websocket_connect(f"/ws/runs/{run_id}") as dashboard:
        assert dashboard.receive_json()["run"]["state"] == "running"
        start = {"type": "start", "rank": 0, "stage": 0, "time_ms": 0.0}
        seq = workers[0].send(
            {"type": "events", "run_id": run_id, "events": [start, _step(0, 0), _step(0, 1)]}
        )
        workers[0].expect_ack(seq)
        workers[0].send({"type": "events", "run_id": run_id, "events": [_step(0, 0)]}, seq)
        workers[0].expect_ack(seq)
        seen = [dashboard.receive_json() for _ in range(2)]
        kinds = {m["type"] for m in seen}
        assert kinds == {"event", "metrics"}
        metrics = next(m for m in seen if m["type"] == "metrics")
        assert [e["step"] for e in metrics["events"]] == [0, 1]
    stored = client.get(f"/api/runs/{run_id}/metrics", params={"kind": "step"}).json()
    assert stored["total"] == 2, "the repeated message was stored twice"
    assert client.get(f"/api/runs/{run_id}").json()["last_step"] == 1
    for worker in workers:
        worker.expect_ack(worker.send({"type": "run_state", "run_id": run_id, "state": "finished"}))
    run = client.get(f"/api/runs/{run_id}").json()
    assert run["state"] == "finished" and run["ended_at"]
    # a finished run takes no proposal: nothing would ever apply it
    refused = client.post(
        "/api/proposals", headers=AUTH, json={"run_id": run_id, "observed_profile": mlp_profile()}
    )
    assert refused.status_code == 409 and "run 1 is finished" in refused.json()["detail"]
    assert client.get("/api/proposals", params={"run_id": run_id}).json()["count"] == 0


def test_metrics_time_range_and_downsampling(client: TestClient, fake: Workers) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    seq = workers[1].send(
        {"type": "events", "run_id": run_id, "events": [_step(1, step) for step in range(100)]}
    )
    workers[1].expect_ack(seq)
    url = f"/api/runs/{run_id}/metrics"
    window = client.get(url, params={"start_ms": 100, "end_ms": 295}).json()
    assert [m["step"] for m in window["data"]] == list(range(10, 30))
    thin = client.get(url, params={"max_points": 10}).json()
    assert (thin["total"], thin["stride"], thin["count"]) == (100, 10, 10)
    assert [m["step"] for m in thin["data"]] == list(range(0, 100, 10))
    bad = client.get(url, params={"start_ms": 5, "end_ms": 1})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "end_ms"]
    memory = {"type": "memory", "stage": 1, "step": 3, "time_ms": 102.0, "allocated": 1}
    workers[1].expect_ack(workers[1].send({"type": "events", "run_id": run_id, "events": [memory]}))
    every = client.get(url, params={"start_ms": 100, "end_ms": 115}).json()["data"]
    assert [(m["kind"], m["step"]) for m in every] == [("memory", 3), ("step", 10), ("step", 11)]
    steps = client.get(url, params={"start_ms": 100, "end_ms": 115, "kind": "step"}).json()
    assert [m["step"] for m in steps["data"]] == [10, 11]
    both = client.get(
        url, params={"start_ms": 100, "end_ms": 115, "kind": ["step", "memory"]}
    ).json()
    assert both["data"] == every


def test_a_gap_in_numbers_closes_the_connection(client: TestClient, fake: Workers) -> None:
    worker = fake()
    worker.send({"type": "heartbeat"}, seq=worker.seq + 5)
    with pytest.raises(WebSocketDisconnect) as closed:
        worker.expect("ack")
    assert closed.value.code == 4409


def test_reconnect_resumes_numbering(client: TestClient, fake: Workers) -> None:
    worker = fake()
    run_id = None
    worker.expect_ack(worker.send({"type": "events", "run_id": 999, "events": []}))
    worker.close()
    again = fake(worker_id=worker.id, secret=worker.secret, next_seq=worker.seq + 1)
    assert (again.id, again.welcome["last_seq"]) == (worker.id, 1)
    listed = client.get("/api/workers").json()
    assert listed["count"] == 1 and listed["data"][0]["state"] == "online"
    assert run_id is None


def test_stop_sends_the_command(client: TestClient, fake: Workers) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    response = client.post(f"/api/runs/{run_id}/stop", headers=AUTH)
    assert response.json()["state"] == "stopped"
    for worker in workers:
        assert worker.expect("command")["command"] == "stop"
    assert client.post(f"/api/runs/{run_id}/stop", headers=AUTH).status_code == 409


@pytest.mark.settings(worker_timeout_s=1.0)
def test_a_silent_worker_is_disconnected_and_is_online_again_once_it_says_hello(
    client: TestClient, fake: Workers
) -> None:
    """A worker recorded offline for its silence has its connection closed: were the link
    to come back, its heartbeats would otherwise flow while it stayed offline. It
    reconnects, says hello with its id, and is online again."""
    worker = fake("a")
    with pytest.raises(WebSocketDisconnect) as closed:
        while True:
            worker.socket.receive_json()
    assert closed.value.code == 1001 and "silent for" in closed.value.reason, closed.value
    assert client.get(f"/api/workers/{worker.id}").json()["state"] == "offline"
    again = fake("a", worker_id=worker.id, secret=worker.secret)
    assert again.id == worker.id
    assert client.get(f"/api/workers/{worker.id}").json()["state"] == "online"


@pytest.mark.settings(worker_timeout_s=2.0)
def test_silent_worker_fails_its_run(client: TestClient, fake: Workers) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    workers[1].close()
    started = time.monotonic()
    while client.get(f"/api/runs/{run_id}").json()["state"] != "failed":
        assert time.monotonic() - started < 15, "the run did not fail"
        workers[0].socket.send_json({"type": "heartbeat"})  # only b falls silent
        time.sleep(0.2)
    run = client.get(f"/api/runs/{run_id}").json()
    assert (
        f"worker b ({workers[1].id}) on 127.0.0.1 with rank(s) 1 has been silent" in run["message"]
    ), run["message"]
    assert workers[0].expect("command")["command"] == "stop"
    states = [client.get(f"/api/workers/{w.id}").json()["state"] for w in workers]
    assert states == ["online", "offline"]


@pytest.mark.parametrize("root_first", [False, True])
def test_a_failed_run_says_its_root_cause_whichever_worker_reports_first(
    client: TestClient, fake: Workers, root_first: bool
) -> None:
    """Rank 1 (worker b) computes a NaN loss; rank 0 (worker a), waiting for its
    gradient, fails naming it. Each worker reports its own rank's words, in either order:
    the run's reason is the root cause's, not the words of the rank that waited on it."""
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    cause = "loss is NaN at step 3 (stage 1)"
    waited = f"rank 0 (stage 0 replica 0) stopped while receiving the gradient: {cause}"
    reports = [(workers[0], waited), (workers[1], cause)]
    for worker, message in reversed(reports) if root_first else reports:
        state = {"run_id": run_id, "state": "failed", "message": message, "retry": False}
        worker.expect_ack(worker.send({"type": "run_state", **state}))
    run = client.get(f"/api/runs/{run_id}").json()
    assert (run["state"], run["message"]) == ("failed", cause), run
    # a report that does not name the stored reason's cause leaves it as it is
    unrelated = {"run_id": run_id, "state": "failed", "message": "rank 0 exited with status 1"}
    workers[0].expect_ack(workers[0].send({"type": "run_state", **unrelated}))
    assert client.get(f"/api/runs/{run_id}").json()["message"] == cause


def test_approved_proposal_migrates_and_records_the_outcome(
    client: TestClient, fake: Workers
) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    observed = mlp_profile()
    for layer in observed["layers"][:2]:
        layer["fwd_ms"], layer["bwd_ms"] = 40.0, 80.0
    response = client.post(
        "/api/proposals", headers=AUTH, json={"run_id": run_id, "observed_profile": observed}
    )
    assert response.status_code == 201, response.text
    proposal = response.json()
    assert proposal["worthwhile"] and proposal["document"]["moves"]
    approved = client.post(
        f"/api/proposals/{proposal['id']}/approve", headers=AUTH, json={"author": "ada"}
    ).json()
    assert (approved["state"], approved["decided_by"]) == ("approved", "ada")
    command = workers[0].expect("command")
    assert command["command"] == "migrate"
    assert command["payload"]["moves"] == proposal["document"]["moves"]
    workers[0].expect_ack(
        workers[0].send(
            {
                "type": "command_result",
                "run_id": run_id,
                "command": "migrate",
                "ok": True,
                "message": "moved",
                "payload": {"proposal_id": proposal["id"]},
            }
        )
    )
    decided = client.get(f"/api/proposals/{proposal['id']}").json()
    assert decided["state"] == "applied"
    assert decided["outcome"].startswith("worker a on "), decided["outcome"]  # its name
    events = client.get(f"/api/runs/{run_id}/events", params={"kind": "migration"}).json()
    assert events["count"] == 1 and events["data"][0]["message"] == "moved"
    again = client.post(f"/api/proposals/{proposal['id']}/reject", headers=AUTH)
    assert again.status_code == 409


def test_proposals_nobody_will_decide_are_closed(client: TestClient, fake: Workers) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    balanced = mlp_profile()  # the plan's stages [block0, block1] and [block2, ..., head]
    for idx, layer in enumerate(balanced["layers"]):
        layer["fwd_ms"], layer["bwd_ms"] = (30.0, 60.0) if idx < 2 else (20.0, 40.0)
    same = client.post(
        "/api/proposals", headers=AUTH, json={"run_id": run_id, "observed_profile": balanced}
    ).json()
    assert not same["document"]["moves"] and not same["document"]["policy_changes"]
    assert same["state"] == "closed" and same["outcome"].startswith("changes nothing: "), same
    observed = mlp_profile()
    for layer in observed["layers"][:2]:
        layer["fwd_ms"], layer["bwd_ms"] = 40.0, 80.0
    waiting = client.post(
        "/api/proposals", headers=AUTH, json={"run_id": run_id, "observed_profile": observed}
    ).json()
    assert waiting["state"] == "pending" and waiting["document"]["moves"]
    with client.websocket_connect(f"/ws/runs/{run_id}") as dashboard:
        assert dashboard.receive_json()["type"] == "run"
        for worker in workers:
            worker.expect_ack(
                worker.send({"type": "run_state", "run_id": run_id, "state": "finished"})
            )
        told = [dashboard.receive_json() for _ in range(2)]
    closed = client.get(f"/api/proposals/{waiting['id']}").json()
    assert closed["state"] == "closed" and closed["decided_at"], closed
    assert closed["outcome"] == f"run {run_id} finished before anyone decided"
    assert {"type": "proposal", "proposal_id": waiting["id"], "state": "closed"}.items() <= next(
        m for m in told if m["type"] == "proposal"
    ).items()
    refused = client.post(f"/api/proposals/{waiting['id']}/approve", headers=AUTH, json={})
    assert refused.status_code == 409 and "already closed" in refused.text


def test_launch_needs_an_approved_plan_and_enough_workers(
    client: TestClient, fake: Workers
) -> None:
    profile_id = add_profile(client, mlp_profile())
    draft = add_plan(client, profile_id, [2])
    body = {"plan_id": draft["id"], "model": "mlp", "steps": 1}
    assert client.post("/api/runs", headers=AUTH, json=body).status_code == 409
    client.post(f"/api/plans/{draft['id']}/approve?force=true", headers=AUTH)
    fake(slots=1)
    refused = client.post("/api/runs", headers=AUTH, json=body)
    assert refused.status_code == 409 and "needs 2 ranks" in refused.json()["detail"]
    assert client.get("/api/runs/77").status_code == 404
