"""Live charts of a running job, from the engine's measured events.

Inputs are the engine's event dicts (``runtime/engine/telemetry/metrics.py``): ``step``
events (per worker and step: ``start_ms``, ``end_ms``, ``busy_ms``, ``recompute_ms``,
``swap_bytes``, ``samples_per_s``, ``loss`` on the last stage) and ``memory`` events (per
worker and step: ``peak_bytes``). Migrations are ``Marker``s drawn as dotted lines at their
step, so a repartition's effect shows on every chart.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipestudio.dashboard.components.style import (
    LIMIT_COLOR,
    MIGRATION_COLOR,
    Figure,
    add_hline,
    add_vline,
    base_layout,
    byte_unit,
    empty_figure,
    near_limits,
)

Event = Mapping[str, Any]
WAITING = "Waiting for the first measured step…"


@dataclass(frozen=True)
class Marker:
    """A migration (or another event) at a step: drawn as a vertical line with a short
    ``label``; the whole ``text`` shows when the pointer is on the label."""

    step: float
    text: str
    label: str = ""


#: Labels of successive markers step down the plot so that neighbours do not overlap.
LABEL_ROWS = 4


def _mark(figure: Figure, markers: Sequence[Marker], xrefs: Sequence[str] = ("x",)) -> None:
    """Draw ``markers``; the step axes start at step 0 (labels never stretch them)."""
    for idx, marker in enumerate(sorted(markers, key=lambda m: m.step)):
        label_y = 1.0 - 0.1 * (idx % LABEL_ROWS)
        for xref in xrefs:
            add_vline(
                figure,
                marker.step,
                (marker.label or marker.text) if xref == xrefs[0] else "",
                MIGRATION_COLOR,
                xref=xref,
                label_y=label_y,
                hovertext=marker.text,
            )
    for xref in xrefs:
        axis = "xaxis" + xref.removeprefix("x")
        figure["layout"].setdefault(axis, {})["rangemode"] = "nonnegative"


def stage_series(events: Sequence[Event]) -> dict[str, list[Event]]:
    """Events per worker, labelled ``stage s`` (``stage s.r`` for replicated stages)."""
    groups: dict[str, list[Event]] = {}
    replicated = {e["stage"] for e in events if e.get("replica", 0) > 0}
    for event in sorted(events, key=lambda e: (e["stage"], e.get("replica", 0), e["step"])):
        label = (
            f"stage {event['stage']}.{event.get('replica', 0)}"
            if event["stage"] in replicated
            else f"stage {event['stage']}"
        )
        groups.setdefault(label, []).append(event)
    return groups


def step_throughput(steps: Sequence[Event]) -> tuple[list[int], list[float]]:
    """Samples/s of the whole pipeline per step: its samples over the span of all workers."""
    spans: dict[int, list[float]] = {}
    samples: dict[int, float] = {}
    for event in steps:
        step = event["step"]
        span = spans.setdefault(step, [event["start_ms"], event["end_ms"]])
        span[0], span[1] = min(span[0], event["start_ms"]), max(span[1], event["end_ms"])
        own_ms = event["end_ms"] - event["start_ms"]
        if own_ms > 0:
            samples[step] = event["samples_per_s"] * own_ms / 1e3
    ordered = sorted(step for step in spans if step in samples)
    rates = [samples[s] / (spans[s][1] - spans[s][0]) * 1e3 for s in ordered]
    return ordered, rates


def _lines(
    groups: Mapping[str, list[Event]], value: Any, unit: str, **extra: Any
) -> list[dict[str, Any]]:
    return [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": label,
            "x": [e["step"] for e in events],
            "y": [value(e) for e in events],
            "hovertemplate": label + " step %{x}: %{y:.2f} " + unit + "<extra></extra>",
            **extra,
        }
        for label, events in groups.items()
    ]


def throughput_figure(
    steps: Sequence[Event],
    markers: Sequence[Marker] = (),
    predicted_samples_per_s: float | None = None,
    calibrated_samples_per_s: float | None = None,
) -> Figure:
    """Measured samples/s per step, with the plan's prediction and, once the run has
    calibrated its profile, the calibrated prediction."""
    title = "Throughput"
    step_idx, rates = step_throughput(steps)
    if not step_idx:
        return empty_figure(WAITING, title)
    data = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "measured",
            "x": step_idx,
            "y": rates,
            "hovertemplate": "step %{x}: %{y:.1f} samples/s<extra></extra>",
        }
    ]
    figure = {
        "data": data,
        "layout": base_layout(
            f"{title} (samples/s; last step {rates[-1]:.1f})",
            "step",
            "samples per second",
            height=300,
        ),
    }
    if predicted_samples_per_s:
        add_hline(
            figure,
            predicted_samples_per_s,
            f"predicted {predicted_samples_per_s:.1f} samples/s",
            "#888888",
        )
    if calibrated_samples_per_s:
        add_hline(
            figure,
            calibrated_samples_per_s,
            f"calibrated {calibrated_samples_per_s:.1f} samples/s",
            "#54A24B",
        )
    _mark(figure, markers)
    return figure


def stage_busy_figure(steps: Sequence[Event], markers: Sequence[Marker] = ()) -> Figure:
    """Measured compute per stage and step: the stage that rises is the new bottleneck."""
    title = "Compute per stage"
    if not steps:
        return empty_figure(WAITING, title)
    figure = {
        "data": _lines(stage_series(steps), lambda e: e["busy_ms"], "ms"),
        "layout": base_layout(f"{title} (ms per step)", "step", "compute (ms)", height=300),
    }
    _mark(figure, markers)
    return figure


def run_memory_figure(
    memory: Sequence[Event], limits_bytes: Mapping[int, int | None], markers: Sequence[Marker] = ()
) -> Figure:
    """Peak memory per stage and step against each stage's device limit."""
    title = "Peak memory per stage"
    if not memory:
        return empty_figure(WAITING, title)
    peak = max(e["peak_bytes"] for e in memory)
    near, far_note = near_limits(peak, limits_bytes.values())
    measure = "peak memory"
    if any("rss_bytes" in e for e in memory):  # a CPU rank's peak is its whole process's
        far_note += "; CPU: whole-process RSS"
        measure = "peak RSS, Python and torch included"
    unit, size = byte_unit(max([peak, *near]))
    figure = {
        "data": _lines(stage_series(memory), lambda e: e["peak_bytes"] / size, unit),
        "layout": base_layout(
            f"{title} ({unit}{far_note})", "step", f"{measure} ({unit})", height=300
        ),
    }
    for limit in near:
        add_hline(figure, limit / size, f"device limit {limit / size:.2f} {unit}", LIMIT_COLOR)
    _mark(figure, markers)
    return figure


def swap_recompute_figure(steps: Sequence[Event], markers: Sequence[Marker] = ()) -> Figure:
    """Recompute time and swapped bytes per stage and step, in two panels."""
    title = "Recompute and swap per stage"
    if not steps:
        return empty_figure(WAITING, title)
    unit, size = byte_unit(max(e.get("swap_bytes", 0) for e in steps))
    groups = stage_series(steps)
    data = _lines(groups, lambda e: e.get("recompute_ms", 0.0), "ms")
    for trace in _lines(
        groups,
        lambda e: e.get("swap_bytes", 0) / size,
        unit,
        xaxis="x2",
        yaxis="y2",
        showlegend=False,
    ):
        data.append(trace)
    for idx, trace in enumerate(data):
        trace["legendgroup"] = trace["name"]
        trace["line"] = {"color": f"hsl({(idx % len(groups)) * 47 % 360}, 60%, 45%)"}
    layout = base_layout(title, "step", "recompute time (ms per step)", height=300)
    layout["xaxis"]["domain"] = [0, 0.46]
    layout["xaxis2"] = {"domain": [0.54, 1], "anchor": "y2", "title": {"text": "step"}}
    layout["yaxis2"] = {"anchor": "x2", "title": {"text": f"swapped to host ({unit} per step)"}}
    figure = {"data": data, "layout": layout}
    _mark(figure, markers, ("x", "x2"))
    return figure


def loss_figure(steps: Sequence[Event], markers: Sequence[Marker] = ()) -> Figure:
    """The loss per step; a loss that is NaN or infinite is a gap in the line, and the
    title names the first step it happened at."""
    title = "Training loss"
    points = sorted((e["step"], e["loss"]) for e in steps if e.get("loss") is not None)
    if not points:
        return empty_figure("Waiting for the last stage to report a loss…", title)
    data = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "loss",
            "x": [p[0] for p in points],
            "y": [p[1] if math.isfinite(p[1]) else None for p in points],
            "hovertemplate": "step %{x}: loss %{y:.4f}<extra></extra>",
        }
    ]
    broken = next((p for p in points if not math.isfinite(p[1])), None)
    summary = (
        f"{'NaN' if math.isnan(broken[1]) else broken[1]} from step {broken[0]}"
        if broken is not None
        else f"last {points[-1][1]:.4f}"
    )
    figure = {
        "data": data,
        "layout": base_layout(
            f"{title} ({summary})", "step", "loss (sum over micro-batches)", height=300
        ),
    }
    _mark(figure, markers)
    return figure
