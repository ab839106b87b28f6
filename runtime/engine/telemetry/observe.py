"""The observed profile: what a running job's layers take now, in the planner's format.

Every ``every`` steps each rank publishes its window of measurements (``meter.py``: mean
forward ms, output and parameter bytes of each layer it ran; its stage's forward, backward
and update totals from the op timeline). ``observed_profile`` merges one window of every
rank into a ``Profile``: a layer's backward is its forward times its stage's measured
backward/forward ratio; its update is its stage's update time per update shared by
parameter bytes; ``saved_bytes`` is taken as the layer's output bytes, the part of the
memory a forward keeps that the engine can see without intercepting autograd.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from pipestudio.planner.formats.profile import Layer, Profile
from pipestudio.runtime.engine.telemetry.meter import LayerMeter
from pipestudio.runtime.engine.telemetry.metrics import Recorder


def window_report(
    recorder: Recorder, meter: LayerMeter, first_step: int, last_step: int
) -> dict[str, Any]:
    """One rank's measurements over steps ``first_step..last_step`` (module docstring)."""
    totals = {"forward": 0.0, "backward": 0.0, "update": 0.0}
    updates = 0
    for op in recorder.timeline:
        if first_step <= op["step"] <= last_step and op["op"] in totals:
            totals[op["op"]] += op["end_ms"] - op["start_ms"]
            updates += op["op"] == "update"
    return {
        "layers": meter.take(),
        "fwd_ms": totals["forward"],
        "bwd_ms": totals["backward"],
        "update_ms": totals["update"] / max(updates, 1),
    }


def observed_profile(
    model: str,
    microbatch_size: int,
    layer_names: Sequence[str],
    edges: list[tuple[str, str]] | None,
    reports: Sequence[Mapping[str, Any]],
) -> Profile:
    """One window of every rank merged into a Profile (module docstring)."""
    layers: dict[str, dict[str, float]] = {}
    for report in reports:
        ratio = report["bwd_ms"] / report["fwd_ms"] if report["fwd_ms"] > 0 else 2.0
        stage_params = sum(m["param_bytes"] for m in report["layers"].values()) or 1
        for name, m in report["layers"].items():
            entry = layers.setdefault(
                name, {"fwd_ms": 0.0, "bwd_ms": 0.0, "calls": 0.0, "update_ms": 0.0}
            )
            calls = m["calls"]
            entry["fwd_ms"] += m["fwd_ms"] * calls
            entry["bwd_ms"] += m["fwd_ms"] * ratio * calls
            entry["calls"] += calls
            entry["update_ms"] = report["update_ms"] * m["param_bytes"] / stage_params
            entry["param_bytes"] = m["param_bytes"]
            entry["output_bytes"] = m["output_bytes"]
    missing = [name for name in layer_names if name not in layers]
    if missing:
        raise ValueError(f"no measurement of layers {missing} in this window")
    return Profile.model_validate(
        {
            "model": model,
            "microbatch_size": microbatch_size,
            "device": "observed",
            "layers": [
                Layer(
                    name=name,
                    fwd_ms=e["fwd_ms"] / e["calls"],
                    bwd_ms=e["bwd_ms"] / e["calls"],
                    update_ms=e["update_ms"],
                    param_bytes=int(e["param_bytes"]),
                    output_bytes=int(e["output_bytes"]),
                    saved_bytes=int(e["output_bytes"]),
                ).model_dump()
                for name, e in ((name, layers[name]) for name in layer_names)
            ],
            "edges": None if edges is None else [{"src": s, "dst": d} for s, d in edges],
            "metadata": {"source": "pipestudio train (observed)"},
        }
    )
