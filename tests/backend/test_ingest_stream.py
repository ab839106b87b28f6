"""Metrics reach dashboards as they arrive, before the commit, and exactly once."""

import asyncio
from typing import Any

from fastapi.testclient import TestClient

from pipestudio.backend.hub import Hub
from pipestudio.backend.ingest import Ingestor
from pipestudio.backend.services.holders import RunHolders
from tests.backend.test_sockets import _start, _step


def _events(seq: int, steps: list[int]) -> dict[str, Any]:
    return {"type": "events", "run_id": 7, "seq": seq, "events": [_step(0, step) for step in steps]}


def test_next_message_streams_before_it_is_stored() -> None:
    async def scenario() -> list[Any]:
        hub = Hub()
        watcher = hub.watch(7)
        ingestor = Ingestor(db=None, hub=hub)  # type: ignore[arg-type]  # never started
        ingestor.holders.runs[7] = RunHolders(
            (0, False), frozenset({"w"}), "w", frozenset({"w"})
        )  # w holds run 7's rank
        ingestor.expect("w", last_seq=4)
        ingestor.expect("stranger", last_seq=0)
        ingestor.submit("w", _events(5, [0, 1]))
        ingestor.submit("w", _events(7, [9]))  # a gap: streamed only once stored
        ingestor.submit("w", _events(5, [0, 1]))  # a repeat: not streamed again
        ingestor.submit("stranger", _events(1, [5]))  # holds no rank: rejected, unseen
        assert [item.early for item in list(ingestor.queue._queue)] == [True, False, False, False]
        return [watcher.get_nowait() for _ in range(watcher.qsize())]

    streamed = asyncio.run(scenario())
    assert [[e["step"] for e in m["events"]] for m in streamed] == [[0, 1]]


def test_dashboard_gets_each_metric_once(client: TestClient, fake: Any) -> None:
    workers = [fake("a"), fake("b")]
    run_id = _start(client, workers)
    with client.websocket_connect(f"/ws/runs/{run_id}") as dashboard:
        assert dashboard.receive_json()["type"] == "run"
        for step in range(3):
            seq = workers[1].send({"type": "events", "run_id": run_id, "events": [_step(1, step)]})
            workers[1].expect_ack(seq)
            message = dashboard.receive_json()
            assert message["type"] == "metrics", message
            assert [e["step"] for e in message["events"]] == [step], "streamed twice"
    stored = client.get(f"/api/runs/{run_id}/metrics", params={"kind": "step"}).json()
    assert stored["total"] == 3
