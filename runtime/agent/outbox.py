"""Numbered messages kept until acked: the worker's half of the exactly-once protocol.

Engine events are batched per run (``add_event``; one ``events`` message per flush) and
every other message is numbered at once (``add``) after flushing the events before it, so
the server sees everything in the order it happened. ``welcome`` tells which numbers the
server already stored; the rest are sent again (``resend_from``).
"""

import time
from collections import OrderedDict
from typing import Any

Message = dict[str, Any]


class Outbox:
    def __init__(self, max_batch: int = 500) -> None:
        self.next_seq = 1
        self.unacked: OrderedDict[int, Message] = OrderedDict()
        self.sent_upto = 0
        self.max_batch = max_batch
        self._events: dict[int, list[Message]] = {}
        self.num_events = 0

    def add_event(self, run_id: int, event: Message) -> None:
        event.setdefault("sent_at", time.time())
        self._events.setdefault(run_id, []).append(event)
        self.num_events += 1

    def add(self, message: Message) -> Message:
        self.flush_events()
        return self._number(message)

    def _number(self, message: Message) -> Message:
        message["seq"] = self.next_seq
        self.unacked[self.next_seq] = message
        self.next_seq += 1
        return message

    def flush_events(self) -> None:
        for run_id, events in self._events.items():
            for start in range(0, len(events), self.max_batch):
                self._number(
                    {
                        "type": "events",
                        "run_id": run_id,
                        "events": events[start : start + self.max_batch],
                    }
                )
        self._events.clear()
        self.num_events = 0

    def ack(self, seq: int) -> None:
        for number in [n for n in self.unacked if n <= seq]:
            del self.unacked[number]

    @property
    def first_unacked(self) -> int:
        return next(iter(self.unacked), self.next_seq)

    def resend_from(self, last_stored_seq: int) -> None:
        """After ``welcome``: forget what the server has, send the rest again."""
        self.ack(last_stored_seq)
        self.sent_upto = last_stored_seq

    def to_send(self) -> list[Message]:
        """Numbered messages not yet sent on this connection, in order."""
        messages = [m for n, m in self.unacked.items() if n > self.sent_upto]
        if messages:
            self.sent_upto = messages[-1]["seq"]
        return messages
