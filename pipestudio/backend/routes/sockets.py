"""The websockets: ``/ws/worker`` for worker agents, ``/ws/runs/{id}`` for dashboards
(the messages are described in ``protocol.py``)."""

import asyncio
import contextlib
import json
import secrets
import time
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from pipestudio.backend.context import AppContext
from pipestudio.backend.errors import NotFoundError
from pipestudio.backend.hub import WorkerLink
from pipestudio.backend.protocol import WORKER_CLOSE_AUTH, WORKER_CLOSE_PROTOCOL
from pipestudio.backend.repositories import Runs
from pipestudio.backend.services import workers
from pipestudio.backend.services.runs import run_public

router = APIRouter()
_HELLO_TIMEOUT_S = 10.0


def _token(websocket: WebSocket) -> str:
    header = websocket.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return websocket.query_params.get("token", "")


@router.websocket("/ws/worker")
async def worker_socket(websocket: WebSocket) -> None:
    context: AppContext = websocket.app.state.context
    expected = context.settings.effective_worker_token or ""
    await websocket.accept()
    if not expected or not secrets.compare_digest(_token(websocket).encode(),
                                                  expected.encode()):
        await websocket.close(WORKER_CLOSE_AUTH, "a valid worker token is required")
        return
    try:
        hello = json.loads(await asyncio.wait_for(websocket.receive_text(), _HELLO_TIMEOUT_S))
    except (TimeoutError, ValueError, WebSocketDisconnect):
        with contextlib.suppress(Exception):
            await websocket.close(WORKER_CLOSE_PROTOCOL, "expected a hello message")
        return
    if not isinstance(hello, dict) or hello.get("type") != "hello":
        await websocket.close(WORKER_CLOSE_PROTOCOL, "expected a hello message")
        return

    def register() -> tuple[Any, Any]:
        with context.db.session() as session:
            return workers.register(session, hello)

    worker, actions = await to_thread.run_sync(register)
    link = WorkerLink(worker.id, websocket)
    assert context.ingestor is not None
    context.ingestor.expect(worker.id, worker.last_seq)
    old = context.hub.attach(link)
    if old is not None:
        with contextlib.suppress(Exception):
            await old.socket.close(1000, "replaced by a new connection")
    await link.send({"type": "welcome", "worker_id": worker.id, "last_seq": worker.last_seq,
                     "heartbeat_s": context.settings.heartbeat_s})
    await context.perform(actions)
    try:
        await _receive(context, link)
    finally:
        context.hub.detach(link)


async def _receive(context: AppContext, link: WorkerLink) -> None:
    assert context.ingestor is not None
    while True:
        try:
            text = await link.socket.receive_text()
        except (WebSocketDisconnect, RuntimeError):
            return
        link.last_seen = time.monotonic()
        try:
            message = json.loads(text)
        except ValueError:
            continue
        if isinstance(message, dict) and "seq" in message:
            context.ingestor.submit(link.worker_id, message)


@router.websocket("/ws/runs/{run_id}")
async def run_socket(websocket: WebSocket, run_id: int) -> None:
    context: AppContext = websocket.app.state.context
    await websocket.accept()

    def snapshot() -> dict[str, Any]:
        with context.db.session() as session:
            return run_public(session, Runs(session).get(run_id)).model_dump(mode="json")

    try:
        run = await to_thread.run_sync(snapshot)
    except NotFoundError as exc:
        await websocket.close(4404, str(exc))
        return
    queue = context.hub.watch(run_id)
    listener = asyncio.create_task(_drain(websocket))
    try:
        await websocket.send_text(json.dumps({"type": "run", "run": run}))
        while not listener.done():
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, listener}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break
            message = getter.result()
            if message is None:
                await websocket.close(1013, "too slow: reconnect and read the gap over REST")
                break
            await websocket.send_text(json.dumps(message))
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        context.hub.unwatch(run_id, queue)
        listener.cancel()


async def _drain(websocket: WebSocket) -> None:
    """Read (and ignore) what a dashboard sends, to notice when it goes away."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            await websocket.receive_text()
