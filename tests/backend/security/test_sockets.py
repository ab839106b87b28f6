"""Every malformed websocket frame closes the socket with a code and a reason
(backend/routes/sockets.py), and nothing is logged with a traceback."""

import logging
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.backend.conftest import ANONYMOUS, WORKER_TOKEN, add_plan, add_profile
from tests.backend.fakes import FakeWorker

WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}
HELLO = {"type": "hello", "name": "w", "host": "h", "next_seq": 1}


def _closed(
    client: TestClient,
    path: str,
    send: Callable[[Any], None] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Connect, optionally send, and return the close code and reason."""
    headers = WORKER if headers is None else headers
    with (
        client.websocket_connect(path, headers=headers) as socket,
        pytest.raises(WebSocketDisconnect) as closed,
    ):
        if send is not None:
            send(socket)
        while True:
            socket.receive_text()
    return closed.value.code, closed.value.reason


@pytest.mark.parametrize(
    ("frame", "code", "reason"),
    [
        (lambda s: s.send_bytes(b"\x00\x01"), 1003, "binary frames"),
        (lambda s: s.send_text("{not json"), 1007, "not JSON"),
        (lambda s: s.send_text("[1, 2]"), 1007, "not an object"),
        (lambda s: s.send_json({**HELLO, "slots": "many"}), 1007, "hello: slots"),
        (lambda s: s.send_json({**HELLO, "runs": [{"run_id": 2**70}]}), 1007, "hello: runs.0"),
        (lambda s: s.send_json({**HELLO, "next_seq": 1.5}), 1007, "hello: next_seq"),
        (lambda s: s.send_json({**HELLO, "name": "x" * 201}), 1007, "hello: name"),
        (lambda s: s.send_json({**HELLO, "host": "a\u0000b"}), 1007, "NUL"),
        (lambda s: s.send_json({**HELLO, "devices": [{"k": float("nan")}]}), 1007, "devices"),
        (lambda s: s.send_json({**HELLO, "devices": [{"name": "x" * 201}]}), 1007, "devices.0"),
        (lambda s: s.send_json({**HELLO, "devices": [{"k" * 65: 1}]}), 1007, "devices.0"),
        (
            lambda s: s.send_json({**HELLO, "devices": [{f"k{i}": i for i in range(33)}]}),
            1007,
            "devices.0",
        ),
        (lambda s: s.send_json({**HELLO, "models": ["m" * 201]}), 1007, "hello: models.0"),
        (lambda s: s.send_json({**HELLO, "allowed_models": ["m" * 201]}), 1007, "allowed_models"),
        (lambda s: s.send_json({"type": "heartbeat"}), 4400, "expected a hello"),
    ],
)
def test_a_bad_first_frame_closes_with_its_code(
    client: TestClient, frame: Any, code: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        found = _closed(client, "/ws/worker", frame)
    assert found[0] == code and reason in found[1], found
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.parametrize(
    ("frame", "code", "reason"),
    [
        (lambda s: s.send_bytes(b"binary"), 1003, "binary frames"),
        (lambda s: s.send_text("NaN-ish garbage"), 1007, "not JSON"),
        (lambda s: s.send_json({"type": "events", "seq": "1"}), 1007, "seq must be"),
        (lambda s: s.send_json({"type": "events", "seq": 2**70}), 1007, "seq must be"),
        (lambda s: s.send_json({"type": "events", "seq": True}), 1007, "seq must be"),
        (lambda s: s.send_json({"type": "shout"}), 1008, "unnumbered message"),
    ],
)
def test_a_bad_frame_after_hello_closes_with_its_code(
    client: TestClient, frame: Any, code: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker = FakeWorker(client, "w")
    with caplog.at_level(logging.INFO), pytest.raises(WebSocketDisconnect) as closed:
        frame(worker.socket)
        while True:
            worker.socket.receive_text()
    assert closed.value.code == code and reason in closed.value.reason, closed.value
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    worker.close()


def test_run_streams_refuse_bad_ids_and_strangers(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    plan = add_plan(client, add_profile(client), [2], approve=True)
    assert plan["id"] >= 1
    with caplog.at_level(logging.INFO):
        assert _closed(client, f"/ws/runs/{2**70}", headers={})[0] == 1008
        assert _closed(client, "/ws/runs/-3", headers={})[0] == 1008
        assert _closed(client, "/ws/runs/12", headers={})[0] == 4404
        assert _closed(client, "/ws/runs/12", headers=ANONYMOUS)[0] == 4401
        assert _closed(client, "/ws/runs/12", headers={"Authorization": "Bearer x"})[0] == 4401
        assert _closed(client, "/ws/elsewhere", headers={})[0] == 1008
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
