"""Runs that resume from their checkpoint after a failure, driven by scripted workers."""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pipestudio.backend.settings import Settings
from tests.backend.conftest import AUTH, add_plan, add_profile, make_settings, mlp_profile
from tests.backend.fakes import FakeWorker

Workers = Callable[..., FakeWorker]


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        database_url,
        worker_timeout_s=2.0,
        resume_wait_s=3.0,
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )


def _launch(client: TestClient, **request: Any) -> dict[str, Any]:
    plan = add_plan(client, add_profile(client, mlp_profile()), [2], approve=True)
    response = client.post(
        "/api/runs",
        headers=AUTH,
        json={"plan_id": plan["id"], "model": "mlp", "steps": 8, **request},
    )
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def _rendezvous(run_id: int, attempt: int, workers: list[FakeWorker]) -> list[dict[str, Any]]:
    """Each worker's assignment of the attempt; rank 0's worker reports the store."""
    assigns = [w.expect("assign") for w in workers]
    assert [(a["run_id"], a["attempt"]) for a in assigns] == [(run_id, attempt)] * 2
    workers[0].send(
        {
            "type": "store",
            "run_id": run_id,
            "attempt": attempt,
            "host": "127.0.0.1",
            "port": 4242 + attempt,
        }
    )
    for worker in workers:
        rendezvous = worker.expect("rendezvous")
        assert (rendezvous["attempt"], rendezvous["port"]) == (attempt, 4242 + attempt)
        worker.expect_ack(
            worker.send(
                {"type": "run_state", "run_id": run_id, "attempt": attempt, "state": "running"}
            )
        )
    return assigns


def _wait_state(
    client: TestClient, run_id: int, state: str, beat: list[FakeWorker]
) -> dict[str, Any]:
    started = time.monotonic()
    while (run := client.get(f"/api/runs/{run_id}").json())["state"] != state:
        assert time.monotonic() - started < 15, f"the run is {run['state']}, not {state}"
        for worker in beat:
            worker.socket.send_json({"type": "heartbeat"})
        time.sleep(0.1)
    return run


def test_checkpoints_and_resume_need_the_backend_directory(
    client: TestClient, database_url: str
) -> None:
    plain = make_settings(database_url)
    assert plain.checkpoint_dir is None
    client.app.state.context.settings = plain  # type: ignore[attr-defined]
    for field, value in (("on_failure", "resume"), ("checkpoint_every", 2)):
        plan = add_plan(client, add_profile(client, mlp_profile()), [2], approve=True)
        response = client.post(
            "/api/runs",
            headers=AUTH,
            json={"plan_id": plan["id"], "model": "mlp", "steps": 8, field: value},
        )
        assert response.status_code == 409, response.text  # the server has no directory
        assert f"{field}={value!r}" in response.text
        assert "PIPESTUDIO_CHECKPOINT_DIR" in response.text
    assert client.get("/api/runs").json()["count"] == 0


def test_a_lost_worker_resumes_the_run_from_its_checkpoint_on_the_workers_left(
    client: TestClient, fake: Workers, tmp_path: Path
) -> None:
    a, b, c = fake("a"), fake("b"), fake("c")
    run = _launch(
        client, on_failure="resume", max_resumes=1, checkpoint_every=2, worker_ids=[a.id, b.id]
    )
    run_id = run["id"]
    assert (run["attempt"], run["settings"]["on_failure"]) == (0, "resume")
    config = _rendezvous(run_id, 0, [a, b])[0]["config"]
    assert config["checkpoint_dir"] == str(tmp_path / "checkpoints" / f"run-{run_id}")
    assert (config["checkpoint_every"], config["resume"]) == (2, False)

    b.close()
    run = _wait_state(client, run_id, "starting", [a, c])
    assert run["attempt"] == 1
    assert [(r["rank"], r["worker_id"]) for r in run["ranks"]] == [(0, a.id), (1, c.id)]
    stop = a.expect("command")
    assert (stop["command"], stop["payload"]["attempt"]) == ("stop", 0)
    # What the first attempt's ranks say now is dropped.
    a.expect_ack(
        a.send(
            {
                "type": "run_state",
                "run_id": run_id,
                "attempt": 0,
                "state": "failed",
                "message": "rank 1 is dead or frozen",
            }
        )
    )
    assert client.get(f"/api/runs/{run_id}").json()["state"] == "starting"
    second = _rendezvous(run_id, 1, [a, c])
    assert second[0]["config"]["resume"] is True
    assert second[0]["config"]["checkpoint_dir"] == config["checkpoint_dir"]
    assert client.get(f"/api/runs/{run_id}").json()["state"] == "running"
    events = client.get(f"/api/runs/{run_id}/events").json()["data"]
    assert [e["kind"] for e in events] == ["launch", "resuming", "resume"]
    assert f"worker b ({b.id})" in events[1]["message"]

    # No resume is left: the next failure fails the run.
    c.expect_ack(
        c.send(
            {
                "type": "run_state",
                "run_id": run_id,
                "attempt": 1,
                "state": "failed",
                "message": "rank 1 failed again",
            }
        )
    )
    run = client.get(f"/api/runs/{run_id}").json()
    assert (run["state"], run["message"]) == ("failed", "rank 1 failed again")
    assert a.expect("command")["payload"]["attempt"] == 1


def test_a_resume_without_free_slots_fails_after_the_wait(
    client: TestClient, fake: Workers
) -> None:
    a, b = fake("a"), fake("b")
    run_id = _launch(client, on_failure="resume")["id"]
    _rendezvous(run_id, 0, [a, b])
    b.close()
    run = _wait_state(client, run_id, "resuming", [a])
    assert run["attempt"] == 1 and run["ranks"] == []
    assert f"worker b ({b.id})" in run["message"]
    run = _wait_state(client, run_id, "failed", [a])
    assert "attempt 1 could not start within 3 s" in run["message"], run["message"]
    assert "needs 2 ranks" in run["message"]


def test_a_refused_configuration_fails_the_run_instead_of_resuming(
    client: TestClient, fake: Workers
) -> None:
    a, b = fake("a"), fake("b")
    run_id = _launch(client, on_failure="resume", max_resumes=2)["id"]
    for worker in (a, b):
        worker.expect("assign")
    text = "worker a: stage 0 names layer 'block9', which the model does not have"
    a.expect_ack(
        a.send(
            {
                "type": "run_state",
                "run_id": run_id,
                "attempt": 0,
                "state": "failed",
                "message": text,
                "retry": False,
            }
        )
    )
    run = client.get(f"/api/runs/{run_id}").json()
    assert (run["state"], run["attempt"], run["message"]) == ("failed", 0, text)
    kinds = [e["kind"] for e in client.get(f"/api/runs/{run_id}/events").json()["data"]]
    assert kinds == ["launch", "failed"]
    assert b.expect("command")["command"] == "stop"
