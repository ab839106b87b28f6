"""The websockets: ``/ws/worker`` for worker agents, ``/ws/runs/{id}`` for dashboards
(the messages are described in ``protocol.py``).

Every frame that is not a protocol message closes the socket with a code and a reason
(``protocol.py``), logged in one line: a hostile client gets an answer, not a traceback.
"""

import asyncio
import contextlib
import json
import logging
import secrets
import time
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from pipestudio.backend.auth import CredentialError
from pipestudio.backend.context import AppContext
from pipestudio.backend.deps import principal_of
from pipestudio.backend.errors import NotFoundError
from pipestudio.backend.hub import WorkerLink
from pipestudio.backend.inputs import SUSPECT, find_unstorable
from pipestudio.backend.protocol import (
    CLOSE_INVALID,
    CLOSE_POLICY,
    CLOSE_UNSUPPORTED,
    MAX_DB_INT,
    MAX_SEQ,
    WORKER_CLOSE_AUTH,
    WORKER_CLOSE_PROTOCOL,
    Hello,
    Reply,
    close_reason,
)
from pipestudio.backend.repositories import Runs
from pipestudio.backend.services import workers
from pipestudio.backend.services.messages import Actions
from pipestudio.backend.services.runs import run_public
from pipestudio.backend.services.workers import Judgment

router = APIRouter()
log = logging.getLogger("pipestudio.backend")
_HELLO_TIMEOUT_S = 10.0


class Refused(Exception):
    """Close the socket with ``code`` and ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


def _token(websocket: WebSocket) -> str:
    header = websocket.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return websocket.query_params.get("token", "")


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    log.info("closing a websocket on %s with %d: %s", websocket.url.path, code, reason)
    with contextlib.suppress(Exception):  # the client may be gone already
        await websocket.close(code, close_reason(reason))


async def _next_object(websocket: WebSocket) -> tuple[dict[str, Any], str] | None:
    """The next frame as a JSON object, and its text; None when the client went away;
    ``Refused`` for a frame that is not one."""
    try:
        frame = await websocket.receive()
    except (WebSocketDisconnect, RuntimeError):
        return None
    if frame["type"] == "websocket.disconnect":
        return None
    text = frame.get("text")
    if text is None:
        raise Refused(
            CLOSE_UNSUPPORTED, "binary frames are not part of the protocol; send JSON text"
        )
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        raise Refused(CLOSE_INVALID, "a frame is not JSON") from None
    if not isinstance(message, dict):
        raise Refused(CLOSE_INVALID, f"a frame is a JSON {type(message).__name__}, not an object")
    return message, text


def _hello(message: dict[str, Any]) -> Hello:
    if message.get("type") != "hello":
        raise Refused(WORKER_CLOSE_PROTOCOL, "expected a hello message")
    try:
        hello = Hello.model_validate(message)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        raise Refused(CLOSE_INVALID, f"hello: {where}: {error['msg']}") from None
    found = find_unstorable(message)
    if found is not None:
        where = ".".join(str(part) for part in found[0])
        raise Refused(CLOSE_INVALID, f"hello: {where} {found[1]}")
    return hello


@router.websocket("/ws/worker")
async def worker_socket(websocket: WebSocket) -> None:
    context: AppContext = websocket.app.state.context
    expected = context.settings.effective_worker_token or ""
    await websocket.accept()
    if not expected or not secrets.compare_digest(_token(websocket).encode(), expected.encode()):
        await _close(websocket, WORKER_CLOSE_AUTH, "a valid worker token is required")
        return
    try:
        frame = await asyncio.wait_for(_next_object(websocket), _HELLO_TIMEOUT_S)
        if frame is None:
            return
        hello = _hello(frame[0])
    except TimeoutError:
        await _close(websocket, WORKER_CLOSE_PROTOCOL, "expected a hello message")
        return
    except Refused as exc:
        await _close(websocket, exc.code, exc.reason)
        return
    await _serve_worker(context, websocket, hello)


async def _serve_worker(context: AppContext, websocket: WebSocket, hello: Hello) -> None:
    assert context.ingestor is not None

    def register() -> tuple[Any, Judgment, str, Actions | None]:
        """The worker, the judgment of its runs (made now when every message it numbered
        is stored, else left to the ingest writer: ``workers.Judgment``) and its secret."""
        with context.db.session() as session:
            worker, judgment, secret = workers.register(session, hello)
            if judgment.after_seq > worker.last_seq:
                return worker, judgment, secret, None
            return worker, judgment, secret, workers.judge(session, judgment)

    try:
        worker, judgment, secret, actions = await to_thread.run_sync(register)
    except workers.IdentityError as exc:
        await _close(websocket, WORKER_CLOSE_AUTH, str(exc))
        return
    link = WorkerLink(worker.id, websocket, probe_port=hello.probe_port, host=hello.host)
    context.ingestor.expect(worker.id, worker.last_seq)
    if actions is None:
        context.ingestor.judge_later(judgment)
        actions = Actions()
    old = context.hub.attach(link)
    if old is not None:
        await _close(old.socket, 1000, "replaced by a new connection")
    await link.send(
        {
            "type": "welcome",
            "worker_id": worker.id,
            "secret": secret,
            "last_seq": worker.last_seq,
            "heartbeat_s": context.settings.heartbeat_s,
        }
    )
    await context.perform(actions)
    try:
        await _receive(context, link)
    except Refused as exc:
        await _close(websocket, exc.code, exc.reason)
    finally:
        context.hub.detach(link)


async def _receive(context: AppContext, link: WorkerLink) -> None:
    assert context.ingestor is not None
    while True:
        frame = await _next_object(link.socket)
        if frame is None:
            return
        message, text = frame
        link.last_seen = time.monotonic()
        seq = message.get("seq")
        if seq is None:
            if message.get("type") == "heartbeat":
                continue
            if message.get("type") == "reply":
                _answer(context, link, message)
                continue
            raise Refused(
                CLOSE_POLICY, f"unnumbered message of type {str(message.get('type'))[:40]!r}"
            )
        if type(seq) is not int or not 1 <= seq <= MAX_SEQ:
            raise Refused(CLOSE_INVALID, f"seq must be an integer 1..2**62, got {str(seq)[:40]}")
        context.ingestor.submit(
            link.worker_id, message, suspect=any(token in text for token in SUSPECT)
        )


def _answer(context: AppContext, link: WorkerLink, message: dict[str, Any]) -> None:
    """Hand a worker's ``reply`` to the request it answers (``protocol.py``); a malformed
    one fails that worker's requests and closes the connection."""
    try:
        reply = Reply.model_validate(message)
        found = find_unstorable(message)
        if found is not None:
            where = ".".join(str(part) for part in found[0])
            raise Refused(CLOSE_INVALID, f"reply: {where} {found[1]}")
    except (ValidationError, Refused) as exc:
        if isinstance(exc, ValidationError):
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in error["loc"])
            exc = Refused(CLOSE_INVALID, f"reply: {where}: {error['msg']}")
        context.hub.fail_requests(link.worker_id, f"it sent a malformed {exc.reason}")
        raise exc from None
    if not context.hub.answer(link.worker_id, reply.model_dump()):
        log.info("worker %s replied to no request of its own: %s", link.worker_id, reply.request_id)


@router.websocket("/ws/runs/{run_id}")
async def run_socket(websocket: WebSocket, run_id: str) -> None:
    """A run's live stream: the run now, then its metrics, events and state changes."""
    context: AppContext = websocket.app.state.context
    await websocket.accept()
    try:
        await _check_reader(context, _token(websocket))
        number = int(run_id) if run_id.isdigit() else 0
        if not 1 <= number <= MAX_DB_INT:
            raise Refused(CLOSE_POLICY, f"run id {run_id[:40]!r} is not an integer 1..{MAX_DB_INT}")
    except Refused as exc:
        await _close(websocket, exc.code, exc.reason)
        return

    def snapshot() -> dict[str, Any]:
        with context.db.session() as session:
            return run_public(session, Runs(session).get(number)).model_dump(mode="json")

    try:
        run = await to_thread.run_sync(snapshot)
    except NotFoundError as exc:
        await _close(websocket, 4404, str(exc))
        return
    await _stream(context, websocket, number, run)


async def _check_reader(context: AppContext, token: str) -> None:
    """A run stream is a read: a credential unless reads are public."""
    if not token:
        if context.settings.public_reads:
            return
        raise Refused(
            WORKER_CLOSE_AUTH,
            "sign in first: send 'Authorization: Bearer <API token or session token>' or ?token=",
        )
    try:
        await principal_of(context, token)
    except CredentialError as exc:
        raise Refused(WORKER_CLOSE_AUTH, str(exc)) from None


async def _stream(
    context: AppContext, websocket: WebSocket, run_id: int, run: dict[str, Any]
) -> None:
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
                await _close(websocket, 1013, "too slow: reconnect and read the gap over REST")
                break
            await websocket.send_text(json.dumps(message))
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        context.hub.unwatch(run_id, queue)
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


async def _drain(websocket: WebSocket) -> None:
    """Read (and ignore) what a dashboard sends, to notice when it goes away; a frame that
    is not JSON text closes the stream."""
    try:
        while await _next_object(websocket) is not None:
            pass
    except Refused as exc:
        await _close(websocket, exc.code, exc.reason)
