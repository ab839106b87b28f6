"""A small discrete-event engine: ops with durations, dependencies and FIFO resources.

An op starts once every op it depends on has ended (or, for start-dependencies, started)
and its resource is free; a resource serves ready ops first come, first served. Resource -1
means no resource: the op never waits for one. The simulator builds the op graph of a plan
and reads the start and end times back.
"""

import heapq
from collections import deque
from dataclasses import dataclass

NO_RESOURCE = -1


@dataclass(frozen=True)
class Timing:
    """When each op started and ended; ``*_seq`` number the start and end events in the
    order the engine processed them, which orders simultaneous events by cause."""

    start_ms: list[float]
    end_ms: list[float]
    start_seq: list[int]
    end_seq: list[int]


class OpGraph:
    """Ops are integers handed out by ``add``; times are milliseconds."""

    def __init__(self) -> None:
        self.duration: list[float] = []
        self.resource: list[int] = []
        self._succs: list[list[int]] = []
        self._start_succs: dict[int, list[int]] = {}
        self.num_resources = 0

    def new_resource(self) -> int:
        self.num_resources += 1
        return self.num_resources - 1

    def add(self, duration_ms: float, resource: int = NO_RESOURCE) -> int:
        assert duration_ms >= 0, duration_ms
        self.duration.append(duration_ms)
        self.resource.append(resource)
        self._succs.append([])
        return len(self.duration) - 1

    def after(self, op: int, dep: int) -> None:
        """``op`` starts no earlier than ``dep`` ends."""
        self._succs[dep].append(op)

    def after_start(self, op: int, dep: int) -> None:
        """``op`` starts no earlier than ``dep`` starts."""
        self._start_succs.setdefault(dep, []).append(op)

    def run(self) -> Timing:
        """Simulate every op."""
        num_ops = len(self.duration)
        start = [-1.0] * num_ops
        end = [-1.0] * num_ops
        start_seq = [0] * num_ops
        end_seq = [0] * num_ops
        seq = 0
        remaining = [0] * num_ops
        for succs in self._succs:
            for succ in succs:
                remaining[succ] += 1
        for succs in self._start_succs.values():
            for succ in succs:
                remaining[succ] += 1
        busy = [False] * self.num_resources
        waiting: list[deque[int]] = [deque() for _ in range(self.num_resources)]
        ending: list[tuple[float, int]] = []  # (end time, op); op ids break ties in FIFO order
        ready_now: deque[int] = deque(op for op in range(num_ops) if remaining[op] == 0)
        now = 0.0
        duration, resource, start_succs = self.duration, self.resource, self._start_succs
        while ready_now or ending:
            # Ops that end now finish before any op starts now, so that an instant
            # transfer frees its memory before the next op allocates.
            if ready_now and not (ending and ending[0][0] <= now):
                op = ready_now.popleft()
                res = resource[op]
                if res >= 0:
                    if busy[res]:
                        waiting[res].append(op)
                        continue
                    busy[res] = True
                start[op] = now
                start_seq[op] = seq
                seq += 1
                heapq.heappush(ending, (now + duration[op], op))
                for succ in start_succs.get(op, ()):
                    remaining[succ] -= 1
                    if remaining[succ] == 0:
                        ready_now.append(succ)
                continue
            now, op = heapq.heappop(ending)
            end[op] = now
            end_seq[op] = seq
            seq += 1
            res = resource[op]
            if res >= 0:
                busy[res] = False
                if waiting[res]:
                    ready_now.appendleft(waiting[res].popleft())
            for succ in self._succs[op]:
                remaining[succ] -= 1
                if remaining[succ] == 0:
                    ready_now.append(succ)
        stuck = [op for op in range(num_ops) if end[op] < 0]
        assert not stuck, f"ops {stuck[:10]} never ran: the op graph has a dependency cycle"
        return Timing(start, end, start_seq, end_seq)
