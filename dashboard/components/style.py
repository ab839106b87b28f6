"""Shared look of the charts: colours, byte units, the base layout, lines and empty charts.

Figures are plain dicts in Plotly's JSON form (``{"data": [...], "layout": {...}}``), which
Dash draws as they are: building ``plotly.graph_objects`` validates every property and costs
ten times more, too much for a chart redrawn while a boundary is dragged.
"""

from collections.abc import Iterable
from typing import Any

#: A Plotly figure in its JSON form.
Figure = dict[str, Any]

#: One colour per op kind of the timeline (``pipestudio.planner.formats.result.OpKind``).
OP_COLORS: dict[str, str] = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "weight": "#FFBF79",
    "recompute": "#B279A2",
    "update": "#54A24B",
    "send_activation": "#72B7B2",
    "send_gradient": "#9D755D",
    "swap_out": "#E45756",
    "swap_in": "#FF9DA6",
    "allreduce": "#EECA3B",
}
IDLE_COLOR = "rgba(150, 150, 150, 0.25)"
LIMIT_COLOR = "#D62728"
MIGRATION_COLOR = "#7F3C8D"

#: What a person reads in legends, per op kind.
OP_LABELS: dict[str, str] = {
    "forward": "forward",
    "backward": "backward",
    "weight": "weight gradient",
    "recompute": "recompute",
    "update": "optimizer update",
    "send_activation": "send activation",
    "send_gradient": "send gradient",
    "swap_out": "swap out (to host)",
    "swap_in": "swap in (from host)",
    "allreduce": "all-reduce",
}

#: Memory kinds of ``MemoryBreakdown``, in stacking order, with their colours.
MEMORY_KINDS: tuple[tuple[str, str, str], ...] = (
    ("weights_bytes", "weights", "#4C78A8"),
    ("weight_versions_bytes", "stashed weight versions", "#9ECAE9"),
    ("gradients_bytes", "gradients", "#54A24B"),
    ("optimizer_bytes", "optimizer state", "#88D27A"),
    ("activations_bytes", "activations", "#F58518"),
    ("workspace_bytes", "workspace", "#FFBF79"),
)

_BYTE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """The binary unit that shows ``max_bytes`` as a number of at least 1, and its size."""
    for name, size in _BYTE_UNITS:
        if max_bytes >= size:
            return name, float(size)
    return "bytes", 1.0


#: What a plan's chart says when there is no prediction to draw (``empty`` of each).
NO_PLAN = "No plan yet: run a planner or make one by hand."

#: A device limit more than this many times the highest value drawn is named in the title
#: instead of drawn: on one axis with it, every line would lie flat on the floor.
FAR_LIMIT = 4.0


def near_limits(peak: float, limits: Iterable[int | None]) -> tuple[list[int], str]:
    """The device limits to draw beside values peaking at ``peak`` bytes, and a note for
    the title naming the limits too far above them to share their axis."""
    known = sorted({limit for limit in limits if limit})
    near = [limit for limit in known if limit <= FAR_LIMIT * peak]
    far = [limit for limit in known if limit not in near]
    if not far:
        return near, ""
    used = peak / far[0]
    share = f"{used:.1%}" if used >= 0.001 else "under 0.1%"
    return near, f"; device limit {format_bytes(far[0])}, {share} used"


def format_bytes(num_bytes: float | None) -> str:
    """``1.50 GiB``; an em dash for an unknown size."""
    if num_bytes is None:
        return "—"
    unit, size = byte_unit(abs(num_bytes))
    return f"{num_bytes:.0f} bytes" if size == 1 else f"{num_bytes / size:.2f} {unit}"


def samples(count: int) -> str:
    return f"{count} sample" if count == 1 else f"{count} samples"


def base_layout(title: str, x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    """Title, axis titles (with units) and a legend above the plot.

    The title hangs from the top of the figure, not from the middle of the top margin,
    so a legend above a tall plot (which ends higher, its place being a fraction of the
    plot's height) does not run into it.
    """
    layout: dict[str, Any] = {
        "title": {
            "text": title,
            "x": 0.01,
            "xanchor": "left",
            "font": {"size": 15},
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": 12},
        },
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"title": {"text": y_title}},
        "legend": {
            "orientation": "h",
            "yanchor": "bottom",
            "y": 1.02,
            "x": 0.01,
            "traceorder": "normal",
        },
        "margin": {"l": 70, "r": 20, "t": 80, "b": 50},
        "template": "plotly_white",
        "hovermode": "closest",
    }
    layout.update(extra)
    return layout


def empty_figure(message: str, title: str = "") -> Figure:
    """A blank chart that says why it is blank and what to do."""
    return {
        "data": [],
        "layout": {
            "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15}},
            "template": "plotly_white",
            "xaxis": {"visible": False},
            "yaxis": {"visible": False},
            "margin": {"l": 20, "r": 20, "t": 50, "b": 20},
            "height": 260,
            "annotations": [
                {
                    "text": message,
                    "showarrow": False,
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": 0.5,
                    "font": {"size": 14, "color": "#666"},
                }
            ],
        },
    }


def add_vline(
    figure: Figure,
    x: float,
    text: str,
    color: str,
    xref: str = "x",
    label_y: float = 1.0,
    hovertext: str | None = None,
) -> None:
    """A dotted vertical line across the plot at ``x``, labelled at ``label_y`` (a fraction
    of the plot's height; the top by default); ``hovertext`` shows over the label."""
    layout = figure["layout"]
    layout.setdefault("shapes", []).append(
        {
            "type": "line",
            "xref": xref,
            "yref": "paper",
            "x0": x,
            "x1": x,
            "y0": 0,
            "y1": 1,
            "line": {"color": color, "width": 2, "dash": "dot"},
        }
    )
    layout.setdefault("annotations", []).append(
        {
            "x": x,
            "xref": xref,
            "y": label_y,
            "yref": "paper",
            "text": text,
            "showarrow": False,
            "xanchor": "right",
            "yanchor": "top",
            "font": {"color": color, "size": 11},
            "bgcolor": "rgba(255,255,255,0.8)",
            **({"hovertext": hovertext} if hovertext else {}),
        }
    )


def add_hline(figure: Figure, y: float, text: str, color: str, yref: str = "y") -> None:
    """A dashed horizontal line across the plot at ``y``, labelled at its right end."""
    layout = figure["layout"]
    layout.setdefault("shapes", []).append(
        {
            "type": "line",
            "xref": "paper",
            "yref": yref,
            "x0": 0,
            "x1": 1,
            "y0": y,
            "y1": y,
            "line": {"color": color, "width": 2, "dash": "dash"},
        }
    )
    layout.setdefault("annotations", []).append(
        {
            "x": 1,
            "xref": "paper",
            "y": y,
            "yref": yref,
            "text": text,
            "showarrow": False,
            "xanchor": "right",
            "yanchor": "bottom",
            "font": {"color": color, "size": 11},
        }
    )
