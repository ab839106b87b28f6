"""One clock for every rank, and marks in time on a device's stream.

At rendezvous rank 0 publishes a start time (seconds since the epoch) through the store;
each rank reads it and from then on tells time as milliseconds since it, with
``time.perf_counter``'s resolution (``Clock``). Ranks on one machine share the system
clock, so their timelines line up exactly; across machines they line up as well as the
machines' clocks agree (NTP keeps them within about a millisecond).

On CUDA, kernels run after the host has queued them, so a host clock would time their
launch. ``Marker`` records a CUDA event instead and turns it into clock time later: when it
is made it records a reference event, waits for it and reads the clock; an event's time is
the reference's plus the ``elapsed_time`` between them, read once the device has finished
it (``resync`` waits at step ends). On CPU a mark is simply the clock's reading.
"""

import time

import torch

Mark = float | torch.cuda.Event


class Clock:
    """Milliseconds since the job's start time ``t0_s`` (seconds since the epoch)."""

    def __init__(self, t0_s: float) -> None:
        wall_s, perf_s = time.time(), time.perf_counter()
        self._offset_ms = (wall_s - t0_s - perf_s) * 1e3

    def now_ms(self) -> float:
        return time.perf_counter() * 1e3 + self._offset_ms


class Marker:
    """Marks on ``device``'s current stream, resolved to ``clock`` time (module docstring)."""

    def __init__(self, clock: Clock, device: torch.device) -> None:
        self.clock = clock
        self.on_cuda = device.type == "cuda"
        self.device = device
        self._reference: torch.cuda.Event | None = None
        self._reference_ms = 0.0
        if self.on_cuda:
            torch.cuda.synchronize(device)
            self._reference = torch.cuda.Event(enable_timing=True)
            self._reference.record()
            self._reference.synchronize()
            self._reference_ms = clock.now_ms()

    def mark(self) -> Mark:
        if not self.on_cuda:
            return self.clock.now_ms()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def resync(self) -> None:
        """Wait for the device's queued work, so that every mark made so far resolves."""
        if self.on_cuda:
            torch.cuda.synchronize(self.device)

    def resolve(self, mark: Mark) -> float:
        """Clock milliseconds of a mark whose work has finished (after ``resync``)."""
        if isinstance(mark, float):
            return mark
        assert self._reference is not None
        return self._reference_ms + self._reference.elapsed_time(mark)
