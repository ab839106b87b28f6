"""The schedule as a Gantt chart: one row per stage (replica), one bar per op, bubbles grey.

Under ``interleaved-1f1b`` a device runs several chunks (stages) on one compute stream, so
its chunks share one row, named by the device and its chunks, and each bar's hover names
its chunk. Under a schedule that splits the backward (``zero-bubble``) the backward's two
halves are told apart: ``input gradient`` (what the previous stage waits for) and
``weight gradient`` (what fills the bubbles).

Compute ops (forward, backward, recompute, update) fill the main lane of a row; transfers
and swaps, which run beside compute, sit in thin lanes under it. Idle time of the compute
stream inside the measured window (the pipeline bubble) is drawn as grey bars.

A 16-stage plan of 32 micro-batches has about 2,000 ops. As Plotly bars they would be
2,000 SVG elements for the browser to build and style at every redraw; here all bars of
one kind are one SVG path (a layout shape of many thick strokes, shown in the legend), so
the chart is a few dozen elements. The details of each op come from a trace that draws
nothing (``mode: none``) but answers hovering along each bar; it shares the shape's
legend group, so a legend click hides both. Rows are numbers on the y axis (row ``i`` at
``y = i``, labelled with its stage), so lanes sit at fixed offsets inside a row, and the
plot's height is fixed per row, so a stroke's width in pixels fills its lane.
"""

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pipestudio.dashboard.components.style import (
    IDLE_COLOR,
    MIGRATION_COLOR,
    NO_PLAN,
    OP_COLORS,
    OP_LABELS,
    Figure,
    add_vline,
    base_layout,
    empty_figure,
)
from pipestudio.planner.formats.result import COMPUTE_OPS, SimResult

#: (top, bottom) of each lane inside a row, in row units from the row's middle.
_LANES = {"compute": (-0.42, 0.08), "send": (0.12, 0.25), "swap": (0.27, 0.40)}
_MIN_IDLE_MS = 1e-6
#: Height of one row in pixels; the chart's plot area is never lower than the minimum.
_ROW_PX = 34
_MIN_PLOT_PX = 130
_MARGIN = {"l": 80, "r": 20, "t": 80, "b": 50}
#: Hover points along a bar at least every this fraction of the time axis (about 20 px).
_HOVER_STEP = 1 / 60

#: A bar to draw: (row index, start ms, end ms, hover text).
Bar = tuple[int, float, float, str]
#: Where each worker's ops are drawn: (stage, replica) -> (row key, row label, op prefix).
#: Workers of one row key share the row (an interleaved device's chunks).
Rows = Mapping[tuple[int, int], tuple[tuple[int, int], str, str]]


def _lane(op: str) -> str:
    if op in COMPUTE_OPS:
        return "compute"
    return "send" if op.startswith("send_") or op == "allreduce" else "swap"


def row_label(stage: int, replica: int, replicated: bool) -> str:
    return f"stage {stage}.{replica}" if replicated else f"stage {stage}"


def result_ops(result: SimResult) -> list[dict[str, Any]]:
    """A SimResult's timeline as plain dicts, the form measured ops arrive in."""
    return [
        {
            "stage": op.stage,
            "replica": op.replica,
            "op": op.op,
            "microbatch": op.microbatch,
            "step": op.step,
            "start_ms": op.start_ms,
            "end_ms": op.end_ms,
        }
        for op in result.timeline
    ]


def idle_spans(
    ops: Sequence[Mapping[str, Any]],
    window: tuple[float, float],
    stream: Callable[[Mapping[str, Any]], tuple[int, int]] | None = None,
) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """Per compute stream (``stream(op)``; default the op's (stage, replica)): the gaps of
    the stream inside ``window``."""
    busy: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for op in ops:
        if op["op"] in COMPUTE_OPS:
            key = stream(op) if stream else (op["stage"], op["replica"])
            busy.setdefault(key, []).append((op["start_ms"], op["end_ms"]))
    gaps: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for worker, spans in busy.items():
        cursor, mine = window[0], []
        for start, end in sorted(spans):
            if start - cursor > _MIN_IDLE_MS and start > window[0]:
                mine.append((cursor, min(start, window[1])))
            cursor = max(cursor, end)
        if window[1] - cursor > _MIN_IDLE_MS:
            mine.append((cursor, window[1]))
        gaps[worker] = [(a, b) for a, b in mine if b - a > _MIN_IDLE_MS]
    return gaps


def kind_layers(
    name: str, color: str, lane: str, bars: Sequence[Bar], row_px: float, hover_step_ms: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The bars of one kind as (a path shape in the legend, its hover trace).

    A bar is a horizontal stroke as thick as its lane (``row_px`` is a row's height in
    pixels): two path commands per bar, where a filled rectangle takes five, for Plotly to
    parse at every redraw. The hover trace has a point in the middle of each bar shorter
    than ``hover_step_ms`` and points every ``hover_step_ms`` at most along a longer one,
    so that hovering anywhere on a bar finds one of its own points within Plotly's hover
    distance.
    """
    top, bottom = _LANES[lane]
    path, x, y, texts = [], [], [], []
    for row, start_ms, end_ms, text in bars:
        middle = round(row + (top + bottom) / 2, 3)
        path.append(f"M{start_ms:.6g},{middle}H{end_ms:.6g}")
        num_points = max(1, math.ceil((end_ms - start_ms) / hover_step_ms))
        step_ms = (end_ms - start_ms) / num_points
        x += [float(f"{start_ms + step_ms * (k + 0.5):.6g}") for k in range(num_points)]
        y += [middle] * num_points
        texts += [text] * num_points
    # the fill colours the legend's symbol; a stroke's path encloses nothing to fill
    shape = {
        "type": "path",
        "path": "".join(path),
        "xref": "x",
        "yref": "y",
        "line": {"color": color, "width": round((bottom - top) * row_px, 1)},
        "fillcolor": color,
        "layer": "between",
        "name": name,
        "showlegend": True,
        "legendgroup": name,
    }
    trace = {
        "type": "scatter",
        "mode": "none",
        "name": name,
        "legendgroup": name,
        "showlegend": False,
        "x": x,
        "y": y,
        "text": texts,
        "hovertemplate": "%{text}<extra></extra>",
        "hoverlabel": {"bgcolor": color},
    }
    return shape, trace


def _op_text(label: str, op: Mapping[str, Any], names: Mapping[str, str]) -> str:
    what = names[op["op"]]
    if op.get("microbatch") is not None:
        what += f" of micro-batch {op['microbatch']}"
    return f"{label}: {what}<br>{op['end_ms'] - op['start_ms']:.2f} ms from {op['start_ms']:.2f} ms"


def chunk_devices_of(result: SimResult) -> dict[int, int] | None:
    """Under ``interleaved-1f1b``, the device of each chunk (stage); None otherwise."""
    if result.schedule != "interleaved-1f1b":
        return None
    return {stage.index: stage.devices[0] for stage in result.stages}


def _gantt_layout(
    title: str, labels: list[str], window: tuple[float, float]
) -> tuple[dict[str, Any], float]:
    """The layout with one labelled row per worker, and a row's height in pixels."""
    plot_px = max(_MIN_PLOT_PX, _ROW_PX * len(labels))
    # about 7 px a character of the tick labels, so a device's list of chunks shows whole
    margin = {**_MARGIN, "l": max(_MARGIN["l"], 7 * max(map(len, labels)))}
    layout = base_layout(
        title,
        "time in the step (ms)",
        "",
        height=plot_px + _MARGIN["t"] + _MARGIN["b"],
        margin=margin,
    )
    layout["yaxis"].update(
        tickmode="array",
        tickvals=list(range(len(labels))),
        ticktext=labels,
        range=[len(labels) - 0.5, -0.5],
        showgrid=False,
        zeroline=False,
        fixedrange=True,
    )
    layout["xaxis"].update(range=list(window), zeroline=False)
    return layout, plot_px / len(labels)


def _bars_by_kind(
    ops: Sequence[Mapping[str, Any]],
    rows: Rows,
    row_index: Mapping[tuple[int, int], int],
    window: tuple[float, float],
) -> list[tuple[str, str, str, list[Bar]]]:
    """(legend name, colour, lane, bars) of the bubbles and of each op kind drawn."""
    labels = {key: label for key, label, _ in rows.values()}
    idle = [
        (
            row_index[key],
            start,
            end,
            f"{labels[key]}: idle (bubble)<br>{end - start:.2f} ms from {start:.2f} ms",
        )
        for key, spans in idle_spans(
            ops, window, lambda op: rows[(op["stage"], op["replica"])][0]
        ).items()
        for start, end in spans
    ]
    kinds = [("idle (bubble)", IDLE_COLOR, "compute", idle)] if idle else []
    # a backward whose weight half runs apart is the input-gradient half
    names = dict(OP_LABELS)
    if any(op["op"] == "weight" for op in ops):
        names["backward"] = "input gradient"
    by_kind: dict[str, list[Bar]] = {}
    for op in ops:
        key, _, prefix = rows[(op["stage"], op["replica"])]
        by_kind.setdefault(op["op"], []).append(
            (row_index[key], op["start_ms"], op["end_ms"], _op_text(prefix, op, names))
        )
    return kinds + [
        (names[kind], OP_COLORS[kind], _lane(kind), by_kind[kind])
        for kind in OP_COLORS
        if kind in by_kind
    ]


def worker_rows(
    ops: Sequence[Mapping[str, Any]],
) -> dict[tuple[int, int], tuple[tuple[int, int], str, str]]:
    """One row per worker (stage, replica), labelled with its stage."""
    replicated = {op["stage"] for op in ops if op["replica"] > 0}
    rows = {}
    for worker in {(op["stage"], op["replica"]) for op in ops}:
        label = row_label(worker[0], worker[1], worker[0] in replicated)
        rows[worker] = (worker, label, label)
    return rows


def device_rows(
    ops: Sequence[Mapping[str, Any]], device_of_stage: Mapping[int, int]
) -> dict[tuple[int, int], tuple[tuple[int, int], str, str]]:
    """One row per device, its chunks (stages) together: ``interleaved-1f1b``."""
    chunks: dict[int, list[int]] = {}
    for stage, device in sorted(device_of_stage.items()):
        chunks.setdefault(device, []).append(stage)
    rows = {}
    for stage, replica in {(op["stage"], op["replica"]) for op in ops}:
        device = device_of_stage[stage]
        label = f"device {device} (chunks {', '.join(map(str, chunks[device]))})"
        rows[(stage, replica)] = ((device, replica), label, f"device {device}, chunk {stage}")
    return rows


def ops_gantt(
    ops: Sequence[Mapping[str, Any]],
    title: str,
    *,
    window: tuple[float, float] | None = None,
    migrations: Iterable[tuple[float, str]] = (),
    empty_message: str = "No ops to draw yet.",
    device_of_stage: Mapping[int, int] | None = None,
) -> Figure:
    """Gantt of ``ops`` (dicts with stage, replica, op, microbatch, start_ms, end_ms); with
    ``device_of_stage`` (interleaved chunks) one row per device. Times are drawn from the
    start of ``window`` (by default the first op's start): a measured step starts minutes
    into its run, and a simulated one after the warm-up step some schedules need."""
    if not ops:
        return empty_figure(empty_message, title)
    if window is None:
        window = (min(op["start_ms"] for op in ops), max(op["end_ms"] for op in ops))
    origin = window[0]
    if origin:
        ops = [
            {**op, "start_ms": op["start_ms"] - origin, "end_ms": op["end_ms"] - origin}
            for op in ops
        ]
        window = (0.0, window[1] - origin)
        migrations = [(time_ms - origin, text) for time_ms, text in migrations]
    rows = worker_rows(ops) if device_of_stage is None else device_rows(ops, device_of_stage)
    labelled = dict(sorted((key, label) for key, label, _ in rows.values()))
    row_index = {key: idx for idx, key in enumerate(labelled)}
    layout, row_px = _gantt_layout(title, list(labelled.values()), window)
    layout["shapes"], data = [], []
    for name, color, lane, bars in _bars_by_kind(ops, rows, row_index, window):
        shape, trace = kind_layers(
            name, color, lane, bars, row_px, (window[1] - window[0]) * _HOVER_STEP or 1.0
        )
        layout["shapes"].append(shape)
        data.append(trace)
    figure = {"data": data, "layout": layout}
    for time_ms, text in migrations:
        add_vline(figure, time_ms, text, MIGRATION_COLOR)
    return figure


def schedule_gantt(result: SimResult | None, empty: str = NO_PLAN) -> Figure:
    """The predicted schedule of one step (or pipedream's measured steps); ``empty`` says
    why there is none."""
    title = "Predicted schedule"
    if result is None:
        return empty_figure(empty, title)
    return ops_gantt(
        result_ops(result),
        f"{title}: step {result.step_time_ms:.1f} ms, bubble {result.bubble_fraction:.0%} "
        f"({result.schedule}, {result.num_microbatches} micro-batches)",
        window=(result.window_start_ms, result.window_end_ms),
        device_of_stage=chunk_devices_of(result),
    )
