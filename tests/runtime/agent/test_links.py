"""A worker's link probe and measurement (``runtime/agent/links.py``), on loopback."""

import asyncio
import contextlib
import secrets
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from pipestudio.runtime.agent import links
from pipestudio.runtime.agent.links import LinkProbe, measure_link


class Probe:
    """A LinkProbe served by an event loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.probe = LinkProbe()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = self.call(self.probe.start("127.0.0.1"))

    def call(self, coroutine):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    def expect(self) -> str:
        key = secrets.token_hex(32)
        self.loop.call_soon_threadsafe(self.probe.expect, key)
        return key

    def close(self) -> None:
        self.call(self.probe.close())
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def probe() -> Iterator[Probe]:
    served = Probe()
    yield served
    served.close()


def test_a_measurement_reports_a_transfer_and_a_round_trip(probe: Probe) -> None:
    measured = measure_link("127.0.0.1", probe.port, probe.expect(), 0.2)
    assert measured.gbps > 0.1 and 0 < measured.latency_ms < 100
    assert measured.bytes >= 2**20 and measured.seconds > 0
    # the transfer grew until it took a quarter of the time asked, or hit the cap
    assert measured.seconds >= 0.05 or measured.bytes * 4 > links.MAX_BULK_BYTES


def test_the_cap_bounds_the_transfer(probe: Probe) -> None:
    measured = measure_link("127.0.0.1", probe.port, probe.expect(), 30.0, max_bytes=2**22)
    assert measured.bytes == 2**22


def _refused(port: int, key: bytes) -> bool:
    """Whether the probe closes a connection that presents ``key`` (and else, that it
    proves it knew the key and echoes a ping)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(key + links.PING)
        try:
            answer = sock.recv(17)
            while 0 < len(answer) < 17:
                answer += sock.recv(17 - len(answer))
        except ConnectionResetError:
            return True
        if answer == b"":
            return True
        assert answer == links.proof(key) + links.PING, answer
        return False


def test_the_probe_serves_only_a_key_it_was_told_and_only_once(probe: Probe) -> None:
    assert _refused(probe.port, secrets.token_bytes(32))
    key = probe.expect()
    assert not _refused(probe.port, bytes.fromhex(key))
    assert _refused(probe.port, bytes.fromhex(key))  # used up
    with pytest.raises(OSError):
        measure_link("127.0.0.1", probe.port, secrets.token_hex(32), 0.1)


def test_the_probe_refuses_a_transfer_over_its_cap(probe: Probe) -> None:
    key = bytes.fromhex(probe.expect())
    with socket.create_connection(("127.0.0.1", probe.port), timeout=5) as sock:
        sock.sendall(key + links.BULK + struct.pack("!Q", links.MAX_BULK_BYTES + 1))
        assert sock.recv(16) == links.proof(key)
        assert sock.recv(8) == b""


def test_the_sender_sends_nothing_to_what_is_no_probe() -> None:
    """A hostile worker may name any address and port as its probe: an echo service there
    gets the key and no more, and the measurement fails naming the address."""
    received = bytearray()
    with socket.create_server(("127.0.0.1", 0)) as server:

        def echo() -> None:
            connection, _ = server.accept()
            # the sender hangs up, maybe with a reset, once it sees its key come back
            with connection, contextlib.suppress(ConnectionError):
                while chunk := connection.recv(65536):
                    received.extend(chunk)
                    connection.sendall(chunk)

        threading.Thread(target=echo, daemon=True).start()
        port = server.getsockname()[1]
        with pytest.raises(ValueError, match=f"127.0.0.1 port {port} answered the key"):
            measure_link("127.0.0.1", port, secrets.token_hex(32), 1.0)
    assert len(received) == links.KEY_BYTES


def test_an_expired_key_is_refused(probe: Probe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(links, "KEY_LIFETIME_S", -1.0)
    assert _refused(probe.port, bytes.fromhex(probe.expect()))


def test_a_key_must_be_64_hex_digits() -> None:
    with pytest.raises(ValueError):
        LinkProbe().expect("abc")
