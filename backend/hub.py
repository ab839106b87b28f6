"""The websocket switchboard: connected workers, dashboards watching runs, and sending to
either from the event loop or from a request's thread."""

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket

log = logging.getLogger("pipestudio.backend")
_WATCHER_QUEUE = 10_000


@dataclass
class WorkerLink:
    """One worker's connection; sends are serialized by a lock."""

    worker_id: str
    socket: WebSocket
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_seen: float = field(default_factory=time.monotonic)
    #: Where the worker's link probe listens (its hello), and the address it advertised.
    probe_port: int | None = None
    host: str = ""

    async def send(self, message: dict[str, Any]) -> None:
        async with self.lock:
            await self.socket.send_text(json.dumps(message))


class Unanswered(RuntimeError):
    """A request to a worker got no reply: it is not connected, went away, or was silent
    past the timeout; the text says which."""


class Hub:
    def __init__(self) -> None:
        self.links: dict[str, WorkerLink] = {}
        #: Requests awaiting a worker's ``reply``: request id -> (worker id, future).
        self.requests: dict[str, tuple[str, asyncio.Future[dict[str, Any]]]] = {}
        self.watchers: dict[int, set[asyncio.Queue[dict[str, Any] | None]]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started = time.monotonic()
        self.disconnected: dict[str, float] = {}

    def attach(self, link: WorkerLink) -> WorkerLink | None:
        """Register a connection; returns the one it replaces, if any."""
        old = self.links.get(link.worker_id)
        self.links[link.worker_id] = link
        self.disconnected.pop(link.worker_id, None)
        return old

    def detach(self, link: WorkerLink) -> None:
        if self.links.get(link.worker_id) is link:
            del self.links[link.worker_id]
            self.disconnected[link.worker_id] = time.monotonic()
            self.fail_requests(link.worker_id, "its connection ended before it replied")

    async def ask(
        self, worker_id: str, message: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        """Send ``message`` with a new ``request_id`` and return the worker's ``reply``;
        ``Unanswered`` when none comes."""
        request_id = secrets.token_hex(16)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.requests[request_id] = (worker_id, future)
        try:
            if not await self.send(worker_id, {**message, "request_id": request_id}):
                raise Unanswered(f"worker {worker_id} is not connected")
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise Unanswered(f"worker {worker_id} did not reply within {timeout_s:g} s") from None
        finally:
            self.requests.pop(request_id, None)

    def answer(self, worker_id: str, reply: dict[str, Any]) -> bool:
        """Hand a ``reply`` to the request it answers; False when it answers none of
        ``worker_id``'s (a reply cannot answer another worker's request)."""
        pending = self.requests.get(str(reply.get("request_id")))
        if pending is None or pending[0] != worker_id or pending[1].done():
            return False
        pending[1].set_result(reply)
        return True

    def fail_requests(self, worker_id: str, reason: str) -> None:
        """End ``worker_id``'s pending requests with ``Unanswered(reason)``."""
        for owner, future in list(self.requests.values()):
            if owner == worker_id and not future.done():
                future.set_exception(Unanswered(f"worker {worker_id}: {reason}"))

    def silent_since(self, worker_id: str) -> float:
        """Monotonic time the worker was last heard from (server start if never)."""
        link = self.links.get(worker_id)
        if link is not None:
            return link.last_seen
        return self.disconnected.get(worker_id, self.started)

    async def send(self, worker_id: str, message: dict[str, Any]) -> bool:
        link = self.links.get(worker_id)
        if link is None:
            return False
        try:
            await link.send(message)
        except Exception as exc:  # a dead socket: the receive loop will detach it
            log.info("sending to worker %s failed: %s", worker_id, exc)
            return False
        return True

    async def disconnect(self, worker_id: str, reason: str) -> None:
        """Close the worker's connection (1001, going away) with ``reason``; it reconnects."""
        link = self.links.get(worker_id)
        if link is None:
            return
        self.detach(link)
        try:
            await link.socket.close(1001, reason[:120])
        except Exception as exc:  # already closed, or the link is dead
            log.info("closing worker %s: %s", worker_id, exc)

    def send_from_thread(self, worker_id: str, message: dict[str, Any]) -> bool:
        assert self.loop is not None
        future = asyncio.run_coroutine_threadsafe(self.send(worker_id, message), self.loop)
        return future.result(timeout=10)

    def watch(self, run_id: int) -> "asyncio.Queue[dict[str, Any] | None]":
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(_WATCHER_QUEUE)
        self.watchers.setdefault(run_id, set()).add(queue)
        return queue

    def unwatch(self, run_id: int, queue: "asyncio.Queue[dict[str, Any] | None]") -> None:
        self.watchers.get(run_id, set()).discard(queue)

    def publish(self, run_id: int, message: dict[str, Any]) -> None:
        """Hand ``message`` to every dashboard watching ``run_id``; a dashboard too slow to
        keep up is disconnected (it reconnects and reads the gap over REST)."""
        for queue in list(self.watchers.get(run_id, ())):
            try:
                queue.put_nowait(message)
            except asyncio.QueueFull:
                self.unwatch(run_id, queue)
                queue._queue.clear()  # type: ignore[attr-defined]
                queue.put_nowait(None)

    def publish_from_thread(self, run_id: int, message: dict[str, Any]) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.publish, run_id, message)
