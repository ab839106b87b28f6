"""Per-stage bars of a simulated plan: compute per step and peak memory against the limit."""

from typing import Any

from pipestudio.dashboard.components.style import (
    IDLE_COLOR,
    LIMIT_COLOR,
    MEMORY_KINDS,
    OP_COLORS,
    Figure,
    base_layout,
    byte_unit,
    empty_figure,
    format_bytes,
)
from pipestudio.planner.formats.result import SimResult

_NO_PLAN = "No plan yet: run a planner or make one by hand."


def stage_labels(result: SimResult) -> list[str]:
    return [
        f"stage {stage.index}" + (f" ×{stage.replicas}" if stage.replicas > 1 else "")
        for stage in result.stages
    ]


def _bar(x: list[str], y: list[float], name: str, color: Any, unit: str) -> dict[str, Any]:
    return {
        "type": "bar",
        "x": x,
        "y": y,
        "name": name,
        "marker": {"color": color},
        "hovertemplate": "%{x}: %{y:.2f} " + unit + "<extra>" + name + "</extra>",
    }


def stage_compute_figure(result: SimResult | None) -> Figure:
    """Compute, recompute and idle time per stage in one step; the bottleneck is named."""
    title = "Compute per stage and step"
    if result is None:
        return empty_figure(_NO_PLAN, title)
    labels = stage_labels(result)
    stages = result.stages
    data = [
        _bar(
            labels,
            [s.busy_ms - s.recompute_ms for s in stages],
            "compute (forward, backward, update)",
            OP_COLORS["forward"],
            "ms",
        ),
        _bar(labels, [s.recompute_ms for s in stages], "recompute", OP_COLORS["recompute"], "ms"),
        _bar(
            labels,
            [max(0.0, result.step_time_ms - s.busy_ms) for s in stages],
            "idle (bubble)",
            IDLE_COLOR,
            "ms",
        ),
    ]
    busiest = max(range(len(stages)), key=lambda idx: stages[idx].busy_ms)
    layout = base_layout(
        f"{title} (ms; step {result.step_time_ms:.1f} ms)",
        "stage",
        "time per step (ms)",
        barmode="stack",
        height=330,
    )
    layout["annotations"] = [
        {
            "x": labels[busiest],
            "y": stages[busiest].busy_ms,
            "text": f"bottleneck: {stages[busiest].busy_ms:.1f} ms",
            "showarrow": True,
            "arrowhead": 2,
            "ay": -30,
        }
    ]
    return {"data": data, "layout": layout}


def stage_memory_figure(result: SimResult | None) -> Figure:
    """Peak memory per stage by kind, with each stage's device limit as a red line."""
    title = "Peak memory per stage"
    if result is None:
        return empty_figure(_NO_PLAN, title)
    labels = stage_labels(result)
    limits = [stage.device_memory_bytes for stage in result.stages]
    unit, size = byte_unit(
        max([s.peak_bytes for s in result.stages] + [limit for limit in limits if limit])
    )
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
        f"{title} ({unit}; plan {verdict})",
        "stage",
        f"peak memory ({unit})",
        barmode="stack",
        height=330,
    )
    layout["annotations"] = annotations
    return {"data": data, "layout": layout}
