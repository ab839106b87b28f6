"""Memory over time of every stage (replica) against its device's limit.

The simulator's memory tracks are step functions; each is one line with horizontal-then-
vertical steps. Under ``interleaved-1f1b`` a device's chunks are one line, their sum:
the device's limit holds for them together. Where a stage first goes over its limit a red
cross says when. Past ten lines the colours repeat, so a legend could not tell the lines
apart (and would cost as much to draw as the lines); hovering a line names its stage
instead.
"""

import bisect

from pipestudio.dashboard.components.gantt import chunk_devices_of, row_label
from pipestudio.dashboard.components.style import (
    LIMIT_COLOR,
    NO_PLAN,
    Figure,
    add_hline,
    base_layout,
    byte_unit,
    empty_figure,
    near_limits,
)
from pipestudio.planner.formats.result import MemoryTrack, SimResult

#: Most lines with a legend entry each: Plotly's colour cycle has ten colours.
MAX_LEGEND_LINES = 10


def device_tracks(result: SimResult) -> list[MemoryTrack]:
    """Under ``interleaved-1f1b``, one track per device: its chunks' tracks summed (as
    ``stage`` the device); otherwise the result's tracks."""
    devices = chunk_devices_of(result)
    if devices is None:
        return list(result.memory_timeline)
    by_device: dict[int, list[MemoryTrack]] = {}
    for track in result.memory_timeline:
        by_device.setdefault(devices[track.stage], []).append(track)
    summed = []
    for device, tracks in sorted(by_device.items()):
        times = sorted({time for track in tracks for time in track.times_ms})
        values = [
            sum(
                track.bytes[index - 1]
                for track in tracks
                if (index := bisect.bisect_right(track.times_ms, time)) > 0
            )
            for time in times
        ]
        summed.append(MemoryTrack(stage=device, replica=0, times_ms=times, bytes=values))
    return summed


def memory_timeline_figure(result: SimResult | None, empty: str = NO_PLAN) -> Figure:
    title = "Memory over time per stage"
    if result is None or not result.memory_timeline:
        return empty_figure(empty, title)
    limits = {stage.index: stage.device_memory_bytes for stage in result.stages}
    tracks = device_tracks(result)
    devices = chunk_devices_of(result)
    if devices is not None:
        title = "Memory over time per device"
        limits = {devices[index]: limit for index, limit in limits.items()}
    peak = max(max(track.bytes, default=0) for track in tracks)
    near, far_note = near_limits(peak, limits.values())
    unit, size = byte_unit(max([peak, *near]))
    replicated = {track.stage for track in tracks if track.replica > 0}
    legend = len(tracks) <= MAX_LEGEND_LINES
    origin = result.window_start_ms  # drawn from the step's start, as the Gantt is
    data = []
    over_x, over_y, over_text = [], [], []
    for track in tracks:
        label = (
            row_label(track.stage, track.replica, track.stage in replicated)
            if devices is None
            else f"device {track.stage}"
        )
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": label,
                "showlegend": legend,
                "x": [time_ms - origin for time_ms in [*track.times_ms, result.window_end_ms]],
                "y": [value / size for value in [*track.bytes, track.bytes[-1]]],
                "line": {"shape": "hv", "width": 1.5},
                "hovertemplate": label + ": %{y:.2f} " + unit + " at %{x:.2f} ms<extra></extra>",
            }
        )
        limit = limits.get(track.stage)
        first = next(
            (idx for idx, value in enumerate(track.bytes) if limit and value > limit), None
        )
        if first is not None:
            over_x.append(track.times_ms[first] - origin)
            over_y.append(track.bytes[first] / size)
            over_text.append(
                f"{label} runs out of memory at {track.times_ms[first] - origin:.1f} ms"
            )
    if over_x:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "first over the limit",
                "x": over_x,
                "y": over_y,
                "text": over_text,
                "hovertemplate": "%{text}<extra></extra>",
                "marker": {"symbol": "x", "size": 12, "color": LIMIT_COLOR},
            }
        )
    hint = ("" if legend else "; hover a line for its stage") + far_note
    layout = base_layout(
        f"{title} ({unit}{hint})", "time in the step (ms)", f"memory ({unit})", height=330
    )
    layout["xaxis"]["range"] = [0.0, result.window_end_ms - origin]
    figure = {"data": data, "layout": layout}
    for limit in near:
        add_hline(figure, limit / size, f"device limit {limit / size:.2f} {unit}", LIMIT_COLOR)
    return figure
