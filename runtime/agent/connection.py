"""The worker's websocket to the backend: hello, resend, heartbeats, reconnect.

``serve_forever`` connects, says ``hello`` (with the worker id from the last connection and
the lowest unacked number), resends what the server has not stored, then sends new messages
every ``flush_s`` and a heartbeat every ``heartbeat_s``. When the connection drops it
reconnects with backoff (0.2 s doubling to 5 s), also when the link has gone quiet: a ping
unanswered for ``PING_TIMEOUT_S`` ends the connection (a host cut off from the network sees
no close, and TCP alone would wait for minutes), and keeps everything unacked meanwhile.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from pipestudio.runtime.agent.identity import Identity
from pipestudio.runtime.agent.outbox import Message, Outbox

log = logging.getLogger("pipestudio.worker")
AUTH_CLOSE_CODE = 4401
#: Close codes another try would meet again: a refused token, a hello the server cannot
#: read (``backend/protocol.py``).
FATAL_CLOSE_CODES = (AUTH_CLOSE_CODE, 1007, 4400)
#: How often the worker pings the backend, and how long it waits for the answer before it
#: takes the connection for dead (module docstring).
PING_INTERVAL_S = 5.0
PING_TIMEOUT_S = 10.0


class AgentAuthError(ValueError):
    """The backend refused the worker token."""


class AgentConnection:
    """One worker's link; ``handle`` gets every message the server sends but acks."""

    def __init__(
        self,
        url: str,
        token: str,
        hello: Callable[[], Message],
        handle: Callable[[Message], Awaitable[None]],
        *,
        flush_s: float = 0.05,
        identity: Identity | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        if self.url.startswith("http"):
            self.url = "ws" + self.url[4:]
        if not self.url.endswith("/ws/worker"):
            self.url += "/ws/worker"
        self.token, self.hello, self.handle, self.flush_s = token, hello, handle, flush_s
        self.outbox = Outbox()
        #: The id and secret of the last ``welcome`` (kept across restarts when the
        #: identity has a state directory): the id is ours alone.
        self.identity = identity or Identity(None, "worker", self.url)
        self.heartbeat_s = 2.0
        self.connected = asyncio.Event()
        self._wake = asyncio.Event()
        #: Unnumbered answers to the server's requests, sent once on this connection.
        self._replies: list[Message] = []
        self.closing = False

    def add_event(self, run_id: int, event: Message) -> None:
        self.outbox.add_event(run_id, event)
        if self.outbox.num_events >= self.outbox.max_batch:
            self._wake.set()

    def send(self, message: Message) -> None:
        """Number and queue a message (sent at once when connected)."""
        self.outbox.add(message)
        self._wake.set()

    def reply(self, message: Message) -> None:
        """Send an unnumbered ``reply`` (to a request that lives as long as the connection:
        it is dropped, not resent, when the connection ends)."""
        self._replies.append({**message, "type": "reply"})
        self._wake.set()

    async def serve_forever(self) -> None:
        delay_s = 0.2
        while not self.closing:
            try:
                async with connect(
                    self.url,
                    additional_headers={"Authorization": f"Bearer {self.token}"},
                    max_size=2**26,
                    open_timeout=10,
                    compression=None,
                    ping_interval=PING_INTERVAL_S,
                    ping_timeout=PING_TIMEOUT_S,
                ) as socket:
                    delay_s = 0.2
                    await self._session(socket)
            except (OSError, ConnectionClosed, InvalidStatus, TimeoutError) as exc:
                if (
                    isinstance(exc, ConnectionClosed)
                    and exc.rcvd
                    and exc.rcvd.code in FATAL_CLOSE_CODES
                ):
                    raise AgentAuthError(
                        f"{self.url} refused this worker ({exc.rcvd.code}): {exc.rcvd.reason}"
                    ) from None
                log.info("connection to %s lost (%s); retrying in %.1f s", self.url, exc, delay_s)
            except InvalidURI as exc:
                raise AgentAuthError(f"server URL {self.url!r} is not valid: {exc}") from None
            finally:
                self.connected.clear()
            if not self.closing:
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)

    async def _session(self, socket: ClientConnection) -> None:
        hello = {
            **self.hello(),
            "type": "hello",
            "worker_id": self.identity.worker_id,
            "secret": self.identity.secret,
            "next_seq": self.outbox.first_unacked,
            "last_seq": self.outbox.next_seq - 1,
        }
        await socket.send(json.dumps(hello))
        welcome = json.loads(await socket.recv())
        if welcome.get("type") != "welcome":
            raise ConnectionError(f"expected welcome from {self.url}, got {welcome!r:.200}")
        self.identity.keep(welcome["worker_id"], welcome.get("secret"))
        self.heartbeat_s = float(welcome.get("heartbeat_s", self.heartbeat_s))
        self.outbox.resend_from(int(welcome["last_seq"]))
        self._replies.clear()  # the requests they answer ended with the last connection
        self.connected.set()
        log.info("registered with %s as worker %s", self.url, self.identity.worker_id)
        sender = asyncio.create_task(self._send_loop(socket))
        try:
            async for text in socket:
                message = json.loads(text)
                if message.get("type") == "ack":
                    self.outbox.ack(int(message["seq"]))
                else:
                    await self.handle(message)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender

    async def _send_loop(self, socket: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_s)
            self._wake.clear()
            await asyncio.sleep(0)
            self.outbox.flush_events()
            replies, self._replies = self._replies, []
            for message in replies:
                await socket.send(json.dumps(message))
            for message in self.outbox.to_send():
                await socket.send(json.dumps(message))
            if loop.time() >= next_beat:
                await socket.send('{"type": "heartbeat"}')
                next_beat = loop.time() + self.heartbeat_s

    async def close(self) -> None:
        self.closing = True
