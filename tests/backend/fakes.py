"""A scripted worker on /ws/worker, to drive the protocol from tests without torch."""

import json
from typing import Any

from fastapi.testclient import TestClient

from tests.backend.conftest import BUILTIN_MODELS, WORKER_TOKEN


class FakeWorker:
    """Says hello, numbers what it sends, and reads messages by type (acks apart)."""

    def __init__(
        self,
        client: TestClient,
        name: str = "fake",
        *,
        slots: int = 1,
        worker_id: str | None = None,
        next_seq: int = 1,
        runs: list[dict[str, Any]] | None = None,
        allowed_models: list[str] | None = None,
        **hello: Any,
    ) -> None:
        self._context = client.websocket_connect(
            "/ws/worker", headers={"Authorization": f"Bearer {WORKER_TOKEN}"}
        )
        self.socket = self._context.__enter__()
        self.socket.send_json(
            {
                "type": "hello",
                "worker_id": worker_id,
                "name": name,
                "host": "127.0.0.1",
                "slots": slots,
                "next_seq": next_seq,
                "devices": [{"kind": "cpu", "index": 0}],
                "runs": runs or [],
                "models": BUILTIN_MODELS,
                "allowed_models": allowed_models or [],
                **hello,
            }
        )
        self.welcome = self.socket.receive_json()
        assert self.welcome["type"] == "welcome", self.welcome
        self.id: str = self.welcome["worker_id"]
        self.secret: str = self.welcome["secret"]
        self.seq = int(self.welcome["last_seq"])
        self.acked: list[int] = []
        self.inbox: list[dict[str, Any]] = []
        self.closed = False

    def send(self, message: dict[str, Any], seq: int | None = None) -> int:
        if seq is None:
            self.seq += 1
            seq = self.seq
        # json.dumps escapes what is not ASCII, as a real client's UTF-8 frame must: a lone
        # surrogate can only arrive as the escape \\udXXX
        self.socket.send_text(json.dumps({**message, "seq": seq}))
        return seq

    def expect(self, kind: str) -> dict[str, Any]:
        for idx, message in enumerate(self.inbox):
            if message["type"] == kind:
                return self.inbox.pop(idx)
        while True:
            message = self.socket.receive_json()
            if message["type"] == "ack":
                self.acked.append(message["seq"])
                if kind == "ack":
                    return message
            elif message["type"] == kind:
                return message
            else:
                self.inbox.append(message)

    def expect_ack(self, seq: int) -> None:
        while seq not in self.acked:
            self.expect("ack")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._context.__exit__(None, None, None)
