"""How a worker measures its link to another: a probe it serves, and the client that
measures against another worker's probe.

The backend asks for a measurement in two steps (``protocol.py``): ``probe_expect`` tells
the receiving worker a one-time key, ``measure_link`` tells the sending worker where that
probe listens and the key. The probe (``LinkProbe``) serves nothing to a connection that
does not present a key it was told within ``KEY_TIMEOUT_S``, forgets each key on first use
or after ``KEY_LIFETIME_S``, and sinks at most ``MAX_BULK_BYTES`` at a time: an open port
that someone else can use only to send it bytes it throws away.

On the wire (TCP), the sender sends the 32 bytes of the key and the probe answers with
``proof(key)``, which only a probe that was told the key can give: the sender sends
nothing more to anything else (an address and port a worker named in its hello may be no
probe at all). Then:

- ``PING`` (one byte): the probe answers ``PING``; the sender times ``PINGS`` of them
  (round trips, median);
- ``BULK`` and an 8-byte length ``n``, then ``n`` bytes: the probe answers with the 8-byte
  count it read once all have arrived. The sender starts at 1 MiB and quadruples ``n``
  until one transfer takes ``seconds`` / 4 or more (or ``n`` reaches the cap), and reports
  that transfer: bandwidth = bytes / (time - one round trip).
"""

import asyncio
import contextlib
import hashlib
import logging
import socket
import statistics
import struct
import time
from dataclasses import dataclass

log = logging.getLogger("pipestudio.worker")
KEY_BYTES = 32
KEY_TIMEOUT_S = 5.0
KEY_LIFETIME_S = 60.0
#: The most one transfer carries, and how long one connection may last.
MAX_BULK_BYTES = 1 << 32
CONNECTION_LIMIT_S = 120.0
PING, BULK = b"\x01", b"\x02"
PINGS = 10
_START_BYTES = 1 << 20
_CHUNK = memoryview(bytes(1 << 20))
_LENGTH = struct.Struct("!Q")


def proof(key: bytes) -> bytes:
    """What a probe answers a key it was told (module docstring)."""
    return hashlib.sha256(b"pipestudio link probe\0" + key).digest()[:16]


@dataclass(frozen=True)
class LinkMeasurement:
    """One direction of one link: what a transfer achieved, and the round trip."""

    gbps: float
    latency_ms: float
    bytes: int
    seconds: float


class LinkProbe:
    """The listening half (module docstring)."""

    def __init__(self) -> None:
        self.port: int | None = None
        self._keys: dict[bytes, float] = {}
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str) -> int:
        """Listen on ``host`` (all addresses when it is none of this machine's, as behind
        NAT) on a port the OS picks; returns the port."""
        try:
            self._server = await asyncio.start_server(self._serve, host, 0)
        except OSError:
            self._server = await asyncio.start_server(self._serve, None, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def expect(self, key_hex: str) -> None:
        """Accept one connection that presents ``key_hex`` (64 hex digits)."""
        key = bytes.fromhex(key_hex)
        if len(key) != KEY_BYTES:
            raise ValueError(f"a probe key is {KEY_BYTES * 2} hex digits")
        now = time.monotonic()
        self._keys = {k: until for k, until in self._keys.items() if until > now}
        self._keys[key] = now + KEY_LIFETIME_S

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            key = await asyncio.wait_for(reader.readexactly(KEY_BYTES), KEY_TIMEOUT_S)
            if self._keys.pop(key, 0.0) < time.monotonic():
                log.info("link probe: refused a connection from %s without a key", peer)
                return
            writer.write(proof(key))
            await asyncio.wait_for(self._exchange(reader, writer), CONNECTION_LIMIT_S)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            log.info("link probe: connection from %s ended: %s", peer, exc or type(exc).__name__)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                kind = await reader.readexactly(1)
            except asyncio.IncompleteReadError:
                return  # the sender is done
            if kind == PING:
                writer.write(PING)
            elif kind == BULK:
                (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
                if length > MAX_BULK_BYTES:
                    raise ValueError(f"a transfer of {length} bytes is over the probe's cap")
                received = 0
                while received < length:
                    chunk = await reader.read(min(length - received, 1 << 20))
                    if not chunk:
                        raise ValueError(f"the sender stopped after {received} of {length} bytes")
                    received += len(chunk)
                writer.write(_LENGTH.pack(received))
            else:
                raise ValueError(f"unknown probe request {kind!r}")
            await writer.drain()


def measure_link(
    host: str, port: int, key_hex: str, seconds: float, *, max_bytes: int = MAX_BULK_BYTES
) -> LinkMeasurement:
    """Measure the link to the probe at ``host``:``port`` (module docstring); ``OSError``
    (or ``ValueError`` for an answer that is not the probe's) when it cannot."""
    key = bytes.fromhex(key_hex)
    timeout = max(seconds * 4, 10.0)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(key)
        if _receive(sock, 16) != proof(key):
            raise ValueError(f"{host} port {port} answered the key as no link probe does")
        trips = []
        for _ in range(PINGS):
            start = time.perf_counter()
            sock.sendall(PING)
            if _receive(sock, 1) != PING:
                raise ValueError("the probe answered a ping with something else")
            trips.append(time.perf_counter() - start)
        rtt = statistics.median(trips)
        length = _START_BYTES
        while True:
            start = time.perf_counter()
            sock.sendall(BULK + _LENGTH.pack(length))
            left = length
            while left:
                piece = _CHUNK[: min(left, len(_CHUNK))]
                sock.sendall(piece)
                left -= len(piece)
            (received,) = _LENGTH.unpack(_receive(sock, _LENGTH.size))
            took = time.perf_counter() - start
            if received != length:
                raise ValueError(f"the probe counted {received} of {length} bytes")
            if took >= seconds / 4 or length * 4 > max_bytes:
                break
            length *= 4
    wire = max(took - rtt, 1e-9)
    return LinkMeasurement(
        gbps=length * 8 / wire / 1e9, latency_ms=rtt / 2 * 1e3, bytes=length, seconds=took
    )


def _receive(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the probe closed the connection")
        data += chunk
    return data
