"""Per-stage bars of a simulated plan: compute per step and peak memory against the limit."""

from typing import Any

from pipestudio.dashboard.components.gantt import chunk_devices_of
from pipestudio.dashboard.components.style import (
    IDLE_COLOR,
    LIMIT_COLOR,
    MEMORY_KINDS,
    NO_PLAN,
    OP_COLORS,
    Figure,
    base_layout,
    byte_unit,
    empty_figure,
    format_bytes,
    near_limits,
)
from pipestudio.planner.formats.result import SimResult


def stage_labels(result: SimResult) -> list[str]:
    if result.schedule == "interleaved-1f1b":
        return [f"chunk {stage.index} · device {stage.devices[0]}" for stage in result.stages]
    return [
        f"stage {stage.index}" + (f" ×{stage.replicas}" if stage.replicas > 1 else "")
        for stage in result.stages
    ]


def _compute_rows(result: SimResult) -> tuple[str, list[tuple[str, float, float]]]:
    """(what a bar is, [(label, busy ms, recompute ms)]): a bar per stage, or under
    ``interleaved-1f1b`` a bar per device, its chunks' time together (they share its
    compute stream, so a chunk's idle time is not the device's)."""
    devices = chunk_devices_of(result)
    if devices is None:
        return "stage", [
            (label, stage.busy_ms, stage.recompute_ms)
            for label, stage in zip(stage_labels(result), result.stages, strict=True)
        ]
    rows: dict[int, tuple[str, float, float]] = {}
    for stage in result.stages:
        device = devices[stage.index]
        _, busy, recompute = rows.get(device, ("", 0.0, 0.0))
        rows[device] = (f"device {device}", busy + stage.busy_ms, recompute + stage.recompute_ms)
    return "device", [rows[device] for device in sorted(rows)]


def _bar(x: list[str], y: list[float], name: str, color: Any, unit: str) -> dict[str, Any]:
    return {
        "type": "bar",
        "x": x,
        "y": y,
        "name": name,
        "marker": {"color": color},
        "hovertemplate": "%{x}: %{y:.2f} " + unit + "<extra>" + name + "</extra>",
    }


def stage_compute_figure(result: SimResult | None, empty: str = NO_PLAN) -> Figure:
    """Compute, recompute and idle time per stage in one step; the bottleneck is named."""
    title = "Compute per stage and step"
    if result is None:
        return empty_figure(empty, title)
    axis, rows = _compute_rows(result)
    title = f"Compute per {axis} and step"
    labels = [label for label, _, _ in rows]
    data = [
        _bar(
            labels,
            [busy - recompute for _, busy, recompute in rows],
            "compute (forward, backward, update)",
            OP_COLORS["forward"],
            "ms",
        ),
        _bar(
            labels,
            [recompute for _, _, recompute in rows],
            "recompute",
            OP_COLORS["recompute"],
            "ms",
        ),
        _bar(
            labels,
            [max(0.0, result.step_time_ms - busy) for _, busy, _ in rows],
            "idle (bubble)",
            IDLE_COLOR,
            "ms",
        ),
    ]
    busiest = max(range(len(rows)), key=lambda idx: rows[idx][1])
    layout = base_layout(
        f"{title} (ms; step {result.step_time_ms:.1f} ms)",
        axis,
        "time per step (ms)",
        barmode="stack",
        height=330,
    )
    layout["annotations"] = [
        {
            "x": labels[busiest],
            "y": rows[busiest][1],
            "text": f"bottleneck: {rows[busiest][1]:.1f} ms",
            "showarrow": True,
            "arrowhead": 2,
            "ay": -30,
        }
    ]
    return {"data": data, "layout": layout}


def stage_memory_figure(result: SimResult | None, empty: str = NO_PLAN) -> Figure:
    """Peak memory per stage by kind, with each stage's device limit as a red line."""
    title = "Peak memory per stage"
    if result is None:
        return empty_figure(empty, title)
    if result.schedule == "interleaved-1f1b":  # a device's total is over time, below
        title = "Peak memory per chunk"
    labels = stage_labels(result)
    peak = max(s.peak_bytes for s in result.stages)
    near, far_note = near_limits(peak, [stage.device_memory_bytes for stage in result.stages])
    limits = [
        stage.device_memory_bytes if stage.device_memory_bytes in near else None
        for stage in result.stages
    ]
    unit, size = byte_unit(max([peak, *near]))
    data = []
    for field, name, color in MEMORY_KINDS:
        values = [getattr(stage.memory, field) / size for stage in result.stages]
        if any(values):
            data.append(_bar(labels, values, name, color, unit))
    if any(limits):
        data.append(
            {
                "type": "scatter",
                "x": labels,
                "name": "device memory limit",
                "mode": "markers",
                "y": [None if limit is None else limit / size for limit in limits],
                "marker": {
                    "symbol": "line-ew-open",
                    "size": 34,
                    "color": LIMIT_COLOR,
                    "line": {"width": 3, "color": LIMIT_COLOR},
                },
                "hovertemplate": "%{x} limit: %{y:.2f} " + unit + "<extra></extra>",
            }
        )
    annotations = [
        {
            "x": label,
            "y": stage.peak_bytes / size,
            "showarrow": True,
            "arrowhead": 2,
            "ay": -30,
            "font": {"color": LIMIT_COLOR},
            "text": f"over by {format_bytes(stage.peak_bytes - stage.device_memory_bytes)}",
        }
        for stage, label in zip(result.stages, labels, strict=True)
        if not stage.fits and stage.device_memory_bytes
    ]
    verdict = "fits" if result.fits else "does NOT fit"
    layout = base_layout(
        f"{title} ({unit}; plan {verdict}{far_note})",
        "chunk" if result.schedule == "interleaved-1f1b" else "stage",
        f"peak memory ({unit})",
        barmode="stack",
        height=330,
    )
    layout["annotations"] = annotations
    # a chunk's label names its device too: the margin grows to hold the labels whole
    layout["xaxis"]["automargin"] = True
    return {"data": data, "layout": layout}
