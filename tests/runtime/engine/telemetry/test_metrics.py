"""The Recorder's step events: each step counts its own ops, however long the run."""

import torch

from pipestudio.runtime.engine.telemetry.metrics import Event, Recorder


class FakeMarker:
    """Marks read from a clock the test sets."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.now_ms = 0.0

    def mark(self) -> float:
        return self.now_ms

    def resync(self) -> None:
        pass

    def resolve(self, mark: float) -> float:
        return mark


def _op(
    recorder: Recorder,
    marker: FakeMarker,
    kind: str,
    step: int,
    start_ms: float,
    end_ms: float,
    microbatch: int | None = 0,
) -> None:
    marker.now_ms = start_ms
    record = recorder.start(kind, microbatch, step)
    marker.now_ms = end_ms
    recorder.stop(record)


def test_step_events_count_only_their_steps_ops() -> None:
    events: list[Event] = []
    marker = FakeMarker()
    recorder = Recorder(1, 0, marker, events.append, samples_per_step=8)  # type: ignore[arg-type]
    _op(recorder, marker, "forward", 0, 0.0, 2.0)
    _op(recorder, marker, "backward", 0, 2.0, 6.0)
    late_send = recorder.start("send_gradient", 0, 0, peer_stage=0, peer_replica=0, bytes=4)
    _op(recorder, marker, "update", 0, 6.0, 7.0, microbatch=None)
    first = recorder.finish_step(0)
    assert (first["start_ms"], first["end_ms"], first["busy_ms"]) == (0.0, 7.0, 7.0)
    assert first["samples_per_s"] == 8 / 7.0 * 1e3

    late_send.end = 9.0  # completes after its step was published
    _op(recorder, marker, "forward", 1, 10.0, 13.0)
    _op(recorder, marker, "recompute", 1, 13.0, 14.0)
    _op(recorder, marker, "backward", 1, 13.0, 16.0)
    second = recorder.finish_step(1)
    assert (second["start_ms"], second["end_ms"], second["busy_ms"]) == (10.0, 16.0, 6.0)
    assert second["recompute_ms"] == 1.0
    sends = [e for e in events if e["type"] == "op" and e["op"] == "send_gradient"]
    assert sends and sends[0]["step"] == 0 and sends[0]["end_ms"] == 9.0
    assert [e["step"] for e in events if e["type"] == "step"] == [0, 1]
    assert len(recorder.timeline) == 7
