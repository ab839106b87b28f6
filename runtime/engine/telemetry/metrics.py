"""Measured ops, steps and memory of one worker, published as events to a sink.

Every op is recorded with the simulator's vocabulary
(``pipestudio.planner.formats.result.TimelineOp``: stage, replica, op, microbatch, step,
start_ms, end_ms, and for transfers the peer and the bytes) on the job's shared clock
(``clock.py``). Events are plain dicts with a ``"type"``:

``op``          one measured op (the fields above);
``step``        a worker finished its part of a step: its span, compute (``busy_ms``),
                recompute, swap and all-reduce time, swap bytes, samples/s over its span,
                on the last stage the step's loss over its micro-batches, and under
                fp16 the ``loss_scale`` the step ran with and whether it ``overflowed``
                (its update skipped on every rank, ``execution/scaling.py``);
``memory``      the worker's memory after the step: CUDA allocated, peak and reserved
                bytes (the peak since the previous step), or on CPU the process's resident
                set (``rss_bytes``) and its peak;

plus ``start``, ``checkpoint``, ``summary`` and ``error`` (``worker.py``, ``launcher.py``).
A sink is any callable taking an event; ``JsonlSink`` appends them to a JSON-lines file.
Recompute ops lie inside the backward that triggered them (non-reentrant checkpointing
recomputes during the backward), so ``busy_ms`` counts them once, in the backward.
"""

import json
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipestudio.runtime.engine.telemetry.clock import Mark, Marker

Event = dict[str, Any]
EventSink = Callable[[Event], None]
_COMPUTE = ("forward", "backward", "weight", "update")


class JsonlSink:
    """Appends each event as one line; one ``write`` per line, so ranks may share a file."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, event: Event) -> None:
        os.write(self._fd, (json.dumps(event) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def memory_stats(device: torch.device) -> dict[str, int]:
    """The worker's memory now; on CUDA the peak since the last call."""
    if device.type == "cuda":
        stats = {
            "allocated_bytes": torch.cuda.memory_allocated(device),
            "peak_bytes": torch.cuda.max_memory_allocated(device),
            "reserved_bytes": torch.cuda.memory_reserved(device),
        }
        torch.cuda.reset_peak_memory_stats(device)
        return stats
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            rss = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = peak
    return {"rss_bytes": rss, "peak_bytes": peak}


@dataclass
class OpRecord:
    """An op being measured; ``end`` is None until it has ended."""

    op: str
    microbatch: int | None
    step: int
    start: Mark
    end: Mark | None = None
    peer_stage: int | None = None
    peer_replica: int | None = None
    bytes: int | None = None


class Recorder:
    """Records one worker's ops and publishes them, and its steps, to ``sink``."""

    def __init__(
        self, stage_idx: int, replica: int, marker: Marker, sink: EventSink, samples_per_step: int
    ) -> None:
        self.stage_idx, self.replica = stage_idx, replica
        self.marker = marker
        self.sink = sink
        self.samples_per_step = samples_per_step
        self.pending: list[OpRecord] = []
        self.timeline: list[Event] = []
        self._unfinished: dict[int, list[Event]] = {}  # ops of steps not yet finished
        self._last_finished = -1  # steps finish in order
        self.steps: list[Event] = []
        self.memory: list[Event] = []
        self.losses: dict[int, list[torch.Tensor]] = {}
        self.scaling: dict[int, Event] = {}  # step -> loss_scale and overflowed

    def start(self, op: str, microbatch: int | None, step: int, **transfer: int | None) -> OpRecord:
        record = OpRecord(op, microbatch, step, self.marker.mark(), **transfer)
        self.pending.append(record)
        return record

    def stop(self, record: OpRecord) -> None:
        record.end = self.marker.mark()

    def span(
        self,
        op: str,
        microbatch: int | None,
        step: int,
        start: Mark,
        end: Mark,
        num_bytes: int | None = None,
    ) -> None:
        self.pending.append(OpRecord(op, microbatch, step, start, end, bytes=num_bytes))

    def add_loss(self, step: int, loss: torch.Tensor) -> None:
        self.losses.setdefault(step, []).append(loss.detach())

    def add_loss_scale(self, step: int, scale: float, overflowed: bool) -> None:
        self.scaling[step] = {"loss_scale": scale, "overflowed": overflowed}

    def flush(self) -> None:
        """Publish every op that has ended (on CUDA after waiting for the device)."""
        self.marker.resync()
        waiting = []
        for record in self.pending:
            if record.end is None:
                waiting.append(record)
                continue
            event = {
                "type": "op",
                "stage": self.stage_idx,
                "replica": self.replica,
                "op": record.op,
                "microbatch": record.microbatch,
                "step": record.step,
                "start_ms": self.marker.resolve(record.start),
                "end_ms": self.marker.resolve(record.end),
            }
            if record.peer_stage is not None:
                event.update(peer_stage=record.peer_stage, peer_replica=record.peer_replica)
            if record.bytes is not None:
                event["bytes"] = record.bytes
            self.timeline.append(event)
            if record.step > self._last_finished:
                self._unfinished.setdefault(record.step, []).append(event)
            self.sink(event)
        self.pending = waiting

    def finish_step(self, step: int) -> Event:
        """Publish the ops so far and the ``step`` and ``memory`` events of ``step``.

        The step's ops are looked up by step, not found by scanning the whole timeline,
        so a step costs the same at the end of a long run as at its start."""
        self.flush()
        ops = self._unfinished.pop(step, [])
        self._last_finished = max(self._last_finished, step)
        compute = [op for op in ops if op["op"] in _COMPUTE]
        start_ms = min((op["start_ms"] for op in compute), default=0.0)
        end_ms = max((op["end_ms"] for op in compute), default=0.0)

        def total_ms(*kinds: str) -> float:
            return sum(op["end_ms"] - op["start_ms"] for op in ops if op["op"] in kinds)

        event: Event = {
            "type": "step",
            "stage": self.stage_idx,
            "replica": self.replica,
            "step": step,
            "start_ms": start_ms,
            "end_ms": end_ms,
            "busy_ms": total_ms(*_COMPUTE),
            "recompute_ms": total_ms("recompute"),
            "swap_ms": total_ms("swap_out", "swap_in"),
            "allreduce_ms": total_ms("allreduce"),
            "swap_bytes": sum(op.get("bytes", 0) for op in ops if op["op"] == "swap_out"),
            "samples_per_s": (
                self.samples_per_step / (end_ms - start_ms) * 1e3 if end_ms > start_ms else 0.0
            ),
        }
        if step in self.losses:
            event["loss"] = float(torch.stack(self.losses.pop(step)).sum())
        event.update(self.scaling.pop(step, {}))
        self.steps.append(event)
        self.sink(event)
        memory = {
            "type": "memory",
            "stage": self.stage_idx,
            "replica": self.replica,
            "step": step,
            "time_ms": end_ms,
            **memory_stats(self.marker.device),
        }
        self.memory.append(memory)
        self.sink(memory)
        return event
