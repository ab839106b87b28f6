"""Links between hosts, as the workers on them measure them (``runtime/agent/links.py``).

One connected worker per host stands for it. The pairs are measured in rounds in which no
host takes part twice (a round-robin tournament: n - 1 rounds for n hosts, n / 2 pairs at
a time), so two measurements never share a host's link and the whole takes about
(n - 1) x ``seconds``. Each pair is measured in one direction, from the first host of the
pair to the second: ``probe_expect`` to the receiver, then ``measure_link`` to the sender
(``protocol.py``).
"""

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any

from pipestudio.backend.errors import ConflictError
from pipestudio.backend.hub import Hub, Unanswered

#: How long a receiver may take to expect a key, and a sender beyond the transfer's time.
_EXPECT_TIMEOUT_S = 10.0
_MEASURE_SLACK_S = 20.0


@dataclass(frozen=True)
class Endpoint:
    """A host and the worker that measures from and to it."""

    worker_id: str
    name: str
    host: str

    def __str__(self) -> str:
        return f"worker {self.name} ({self.worker_id}) on {self.host}"


def rounds(count: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``count`` members once, in rounds of disjoint pairs (the circle
    method: one member stays, the others turn)."""
    members: list[int | None] = list(range(count))
    if count % 2:
        members.append(None)  # the member paired with it sits the round out
    size = len(members)
    result = []
    for _ in range(size - 1):
        pairs = []
        for idx in range(size // 2):
            first, second = members[idx], members[size - 1 - idx]
            if first is not None and second is not None:
                pairs.append((min(first, second), max(first, second)))
        result.append(pairs)
        members = [members[0], members[-1], *members[1:-1]]
    return result


async def measure_links(
    hub: Hub, endpoints: list[Endpoint], seconds: float
) -> list[dict[str, Any]]:
    """The measured link of every pair of ``endpoints`` (module docstring);
    ``ConflictError`` naming the pair and the reason when one cannot be measured."""
    links = []
    for pairs in rounds(len(endpoints)):
        links += await asyncio.gather(
            *(measure_pair(hub, endpoints[a], endpoints[b], seconds) for a, b in pairs)
        )
    return links


async def measure_pair(
    hub: Hub, sender: Endpoint, receiver: Endpoint, seconds: float
) -> dict[str, Any]:
    what = f"the link from {sender} to {receiver}"
    link = hub.links.get(receiver.worker_id)
    if link is None:
        raise ConflictError(f"cannot measure {what}: {receiver} is not connected")
    if link.probe_port is None:
        raise ConflictError(
            f"cannot measure {what}: {receiver} serves no link probe (its hello named no "
            "probe_port: a worker of an older version?)"
        )
    key = secrets.token_hex(32)
    try:
        expected = await hub.ask(
            receiver.worker_id, {"type": "probe_expect", "key": key}, _EXPECT_TIMEOUT_S
        )
        if expected["ok"]:
            reply = await hub.ask(
                sender.worker_id,
                {
                    "type": "measure_link",
                    "host": receiver.host,
                    "port": link.probe_port,
                    "key": key,
                    "seconds": seconds,
                },
                seconds * 4 + _MEASURE_SLACK_S,
            )
        else:
            reply = expected
    except Unanswered as exc:
        raise ConflictError(f"cannot measure {what}: {exc}") from None
    if not reply["ok"] or reply.get("gbps") is None:
        raise ConflictError(f"cannot measure {what}: {reply.get('message') or 'it failed'}")
    return {
        "from_worker": sender.worker_id,
        "from_host": sender.host,
        "to_worker": receiver.worker_id,
        "to_host": receiver.host,
        "gbps": reply["gbps"],
        "latency_ms": reply.get("latency_ms"),
        "bytes": reply.get("bytes"),
        "seconds": reply.get("seconds"),
    }


def measure_from_thread(
    hub: Hub, endpoints: list[Endpoint], seconds: float
) -> list[dict[str, Any]]:
    """``measure_links`` on the hub's event loop, from a request's thread."""
    assert hub.loop is not None, "the hub runs on the server's event loop"
    future = asyncio.run_coroutine_threadsafe(measure_links(hub, endpoints, seconds), hub.loop)
    return future.result()
