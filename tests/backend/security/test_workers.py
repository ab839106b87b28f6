"""Workers keep their id across restarts (known by name and host) and offline workers
older than the retention period leave the lists (services/workers.py)."""

from collections.abc import Callable
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from starlette.websockets import WebSocketDisconnect

from pipestudio.backend import models
from tests.backend.conftest import WORKER_TOKEN
from tests.backend.fakes import FakeWorker

Workers = Callable[..., FakeWorker]
WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}


def test_a_restarted_worker_keeps_its_id(client: TestClient, fake: Workers) -> None:
    first = fake("gpu-node-1")
    first.expect_ack(first.send({"type": "events", "run_id": 1, "events": []}))
    first.expect_ack(first.send({"type": "events", "run_id": 1, "events": []}))
    first.close()
    # a new process with the id and secret its state directory kept, numbering from 1
    restarted = fake("gpu-node-1", worker_id=first.id, secret=first.secret, last_seq=0)
    assert restarted.id == first.id
    assert restarted.welcome["last_seq"] == 0, "its old numbers would hide its new messages"
    restarted.expect_ack(restarted.send({"type": "events", "run_id": 1, "events": []}))
    assert fake("gpu-node-1").id != first.id, "a name alone claims no id"
    assert client.get("/api/workers").json()["count"] == 2


def test_old_offline_workers_leave_the_list(client: TestClient, fake: Workers) -> None:
    gone, here = fake("gone"), fake("here")
    gone.close()
    context = client.app.state.context  # type: ignore[attr-defined]
    with context.db.session() as session:
        session.execute(
            update(models.Worker)
            .where(models.Worker.id == gone.id)
            .values(state="offline", last_seen_at=models.utcnow() - timedelta(days=2))
        )
    names = [w["name"] for w in client.get("/api/workers").json()["data"]]
    assert names == ["here"]
    every = client.get("/api/workers", params={"include_retired": True}).json()["data"]
    assert sorted(w["name"] for w in every) == ["gone", "here"]
    assert client.get(f"/api/workers/{gone.id}").status_code == 200
    assert here.id


def test_nobody_takes_a_connected_workers_id(client: TestClient, fake: Workers) -> None:
    """Worker ids are public (GET /api/workers); a connection that says one without the
    secret its worker was given is refused, and the worker keeps its connection."""
    real = fake("w1")
    for secret in (None, "guessed"):
        with (
            client.websocket_connect("/ws/worker", headers=WORKER) as socket,
            pytest.raises(WebSocketDisconnect) as refused,
        ):
            socket.send_json(
                {
                    "type": "hello",
                    "name": "w1",
                    "host": "127.0.0.1",
                    "worker_id": real.id,
                    "secret": secret,
                    "runs": [],
                }
            )
            socket.receive_json()
        assert refused.value.code == 4401 and "another worker's" in refused.value.reason
    real.expect_ack(real.send({"type": "events", "run_id": 1, "events": []}))
    listed = client.get(f"/api/workers/{real.id}").json()
    assert listed["state"] == "online" and listed["name"] == "w1"
    real.close()
    back = fake("w1", worker_id=real.id, secret=real.secret, next_seq=real.seq + 1)
    assert back.id == real.id and back.secret == real.secret
