"""Per-layer charts of a profile: forward/backward time and parameter/saved/output bytes."""

from pipestudio.dashboard.components.style import (
    Figure,
    base_layout,
    byte_unit,
    empty_figure,
    samples,
)
from pipestudio.planner.formats.profile import Profile

_HOVER = "layer %{x}: %{customdata[0]} (%{customdata[1]})<br>%{fullData.name}: %{y:.3f} "


def _bars(
    profile: Profile, fields: tuple[tuple[str, str, str], ...], scale: float, unit: str
) -> list[dict[str, object]]:
    index = list(range(profile.num_layers))
    names = [[layer.name, layer.kind] for layer in profile.layers]
    return [
        {
            "type": "bar",
            "x": index,
            "name": label,
            "y": [getattr(layer, field) / scale for layer in profile.layers],
            "marker": {"color": color, "line": {"width": 0}},
            "customdata": names,
            "hovertemplate": _HOVER + unit + "<extra></extra>",
        }
        for field, label, color in fields
    ]


def layer_time_figure(profile: Profile | None) -> Figure:
    """Forward and backward time of every layer, stacked, at the profile's micro-batch size."""
    title = "Time per layer"
    if profile is None:
        return empty_figure("Pick a profile to see its layers.", title)
    fields = (("fwd_ms", "forward", "#4C78A8"), ("bwd_ms", "backward", "#F58518"))
    return {
        "data": _bars(profile, fields, 1.0, "ms"),
        "layout": base_layout(
            f"{title} (ms, micro-batch of {samples(profile.microbatch_size)})",
            "layer (index in pipeline order)",
            "time per micro-batch (ms)",
            barmode="stack",
            bargap=0.1,
            height=330,
        ),
    }


def layer_bytes_figure(profile: Profile | None) -> Figure:
    """Parameter, saved-for-backward and output bytes of every layer, side by side."""
    title = "Memory per layer"
    if profile is None:
        return empty_figure("Pick a profile to see its layers.", title)
    fields = (
        ("param_bytes", "parameters", "#54A24B"),
        ("saved_bytes", "saved for backward", "#F58518"),
        ("output_bytes", "output (sent on)", "#72B7B2"),
    )
    largest = max(max(getattr(layer, f) for layer in profile.layers) for f, _, _ in fields)
    unit, size = byte_unit(largest)
    return {
        "data": _bars(profile, fields, size, unit),
        "layout": base_layout(
            f"{title} ({unit}, micro-batch of {samples(profile.microbatch_size)})",
            "layer (index in pipeline order)",
            f"size ({unit})",
            barmode="group",
            bargap=0.1,
            height=330,
        ),
    }
