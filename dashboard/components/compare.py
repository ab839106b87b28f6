"""Plans side by side: a table of their predictions and bars of the figures that matter."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipestudio.dashboard.components.style import (
    LIMIT_COLOR,
    Figure,
    base_layout,
    byte_unit,
    empty_figure,
    format_bytes,
)
from pipestudio.planner.formats.result import SimResult


@dataclass(frozen=True)
class Candidate:
    """One plan to compare: its predicted figures, or why there is none."""

    name: str
    step_time_ms: float | None
    error: str | None = None
    planner_ms: float | None = None
    samples_per_s: float = 0.0
    bubble_fraction: float = 0.0
    fits: bool = True
    peak_bytes: int = 0
    device_memory_bytes: int | None = None
    claim: str | None = None  # what the planner proved of the step (``step_claim``)
    #: The plan's replicas per stage (its length is the number of stages); empty: no plan.
    replicas: tuple[int, ...] = ()

    @classmethod
    def of(cls, name: str, result: SimResult, planner_ms: float | None = None) -> "Candidate":
        limits = [s.device_memory_bytes for s in result.stages if s.device_memory_bytes]
        return cls(
            name,
            result.step_time_ms,
            None,
            planner_ms,
            result.samples_per_s,
            result.bubble_fraction,
            result.fits,
            result.largest_peak_bytes,
            min(limits) if limits else None,
        )


COMPARE_COLUMNS = (
    "plan",
    "stages",
    "replicas",
    "step time (ms)",
    "samples/s",
    "bubble",
    "peak memory",
    "device limit",
    "fits",
    "proven",
    "planner time (ms)",
)


def summary_peaks(summary: dict[str, Any]) -> list[int]:
    """A stored plan summary's peaks: per device (an interleaved device's chunks
    together), or per stage in a summary stored before device peaks were."""
    return list(summary.get("device_peak_bytes") or summary.get("stage_peak_bytes") or [])


def replicas_text(replicas: Sequence[int]) -> str:
    """``1`` each, or every stage's count: a planner may trade stages for replicas."""
    if not replicas:
        return "—"
    return "1 each" if set(replicas) == {1} else " · ".join(map(str, replicas))


def outcome_counts(candidates: Sequence[Candidate]) -> tuple[int, int, int]:
    """How many candidates fit, how many have a plan that does not fit, how many none."""
    fitting = sum(1 for c in candidates if c.step_time_ms is not None and c.fits)
    unfit = sum(1 for c in candidates if c.step_time_ms is not None and not c.fits)
    return fitting, unfit, len(candidates) - fitting - unfit


def compare_rows(candidates: Sequence[Candidate]) -> list[dict[str, str]]:
    """One row of text per candidate, keyed by ``COMPARE_COLUMNS``."""
    rows = []
    for c in candidates:
        row = dict.fromkeys(COMPARE_COLUMNS, "—")
        row["plan"] = c.name
        if c.replicas:
            row["stages"] = str(len(c.replicas))
            row["replicas"] = replicas_text(c.replicas)
        if c.planner_ms is not None:
            row["planner time (ms)"] = f"{c.planner_ms:.0f}"
        if c.step_time_ms is None:
            row["fits"] = f"no plan: {c.error or 'unknown reason'}"
        else:
            row.update(
                {
                    "step time (ms)": f"{c.step_time_ms:.2f}",
                    "samples/s": f"{c.samples_per_s:.1f}",
                    "bubble": f"{c.bubble_fraction:.1%}",
                    "peak memory": format_bytes(c.peak_bytes),
                    "device limit": (
                        "unlimited"
                        if c.device_memory_bytes is None
                        else format_bytes(c.device_memory_bytes)
                    ),
                    "fits": "yes" if c.fits else "NO",
                    "proven": c.claim or "—",
                }
            )
        rows.append(row)
    return rows


def _panel(col: int, title: str) -> dict[str, Any]:
    """Axes of the ``col``-th of three side-by-side panels."""
    suffix = "" if col == 1 else str(col)
    left = (col - 1) / 3
    return {
        f"xaxis{suffix}": {"domain": [left + 0.02, left + 0.3], "anchor": f"y{suffix}"},
        f"yaxis{suffix}": {"anchor": f"x{suffix}", "title": {"text": title}},
    }


def compare_figure(candidates: Sequence[Candidate]) -> Figure:
    """Step time, bubble and peak memory of every plan that has a prediction."""
    title = "Plans compared"
    ready = [c for c in candidates if c.step_time_ms is not None]
    if not ready:
        return empty_figure("Run one or all planners to compare their plans.", title)
    names = [c.name for c in ready]
    limits = [c.device_memory_bytes for c in ready]
    unit, size = byte_unit(max([c.peak_bytes for c in ready] + [m for m in limits if m]))
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "x": names,
            "y": [c.step_time_ms for c in ready],
            "name": "step time (ms)",
            "marker": {"color": "#4C78A8"},
            "hovertemplate": "%{x}: %{y:.2f} ms<extra></extra>",
        },
        {
            "type": "bar",
            "x": names,
            "y": [c.bubble_fraction * 100 for c in ready],
            "name": "bubble (%)",
            "marker": {"color": "#BAB0AC"},
            "xaxis": "x2",
            "yaxis": "y2",
            "hovertemplate": "%{x}: %{y:.1f} %<extra></extra>",
        },
        {
            "type": "bar",
            "x": names,
            "y": [c.peak_bytes / size for c in ready],
            "name": f"peak memory ({unit}; red: does not fit)",
            "xaxis": "x3",
            "yaxis": "y3",
            "marker": {"color": ["#54A24B" if c.fits else LIMIT_COLOR for c in ready]},
            "hovertemplate": "%{x}: %{y:.2f} " + unit + "<extra></extra>",
        },
    ]
    if any(limits):
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": names,
                "xaxis": "x3",
                "yaxis": "y3",
                "name": "device memory limit",
                "y": [None if m is None else m / size for m in limits],
                "marker": {
                    "symbol": "line-ew-open",
                    "size": 30,
                    "color": LIMIT_COLOR,
                    "line": {"width": 3, "color": LIMIT_COLOR},
                },
            }
        )
    layout = base_layout(title, "", "", height=340)
    layout.update(_panel(1, "step time (ms)"))
    layout.update(_panel(2, "bubble (% of the step)"))
    layout.update(_panel(3, f"largest device peak ({unit})"))
    return {"data": data, "layout": layout}
