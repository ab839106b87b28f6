"""Prediction against measurement: a run's step and stages, measured, predicted from the
profile and predicted from the profile calibrated on the run (``GET
/api/runs/{id}/calibrated-profile``)."""

from typing import Any

from dash import html

from pipestudio.dashboard.widgets import table

FIDELITY_COLUMNS = (
    "",
    "measured (ms)",
    "predicted (ms)",
    "measured vs predicted",
    "calibrated (ms)",
    "measured vs calibrated",
)


def samples_per_s(step_ms: float | None, samples_per_step: int) -> float | None:
    return None if not step_ms else samples_per_step / step_ms * 1e3


def headline(calibration: dict[str, Any], samples_per_step: int) -> str:
    """Samples/s measured, predicted and calibrated, with how far the run is off each."""
    step = calibration["step_ms"]
    measured = samples_per_s(step["measured"], samples_per_step)
    if measured is None:
        return "Waiting for a measured step to compare with the predictions."
    first, last = calibration["steps"]
    predicted = samples_per_s(step["predicted"], samples_per_step)
    calibrated = samples_per_s(step["calibrated"], samples_per_step)
    return (
        f"Measured {measured:.1f} samples/s · predicted {predicted:.1f} "
        f"({_relative(measured, predicted)}) · calibrated {calibrated:.1f} "
        f"({_relative(measured, calibrated)}) · steps {first}..{last}" + _utilisation(calibration)
    )


def _utilisation(calibration: dict[str, Any]) -> str:
    """The run's achieved TFLOP/s over its measured step, and its model FLOP utilisation
    where the device's peak is known; nothing when the profile counts no FLOPs."""
    flops, step = calibration.get("model_flops"), calibration["step_ms"]["measured"]
    if not flops or not step:
        return ""
    tflops = flops / step / 1e9
    text = f" · {tflops:.3g} TFLOP/s"
    peak, devices = calibration.get("peak_tflops"), calibration.get("num_devices") or 0
    if peak and devices:
        text += f" (MFU {100 * tflops / (peak * devices):.1f}%)"
    return text


def fidelity_view(
    calibration: dict[str, Any] | None, samples_per_step: int, waiting: str
) -> html.Div:
    """The headline and a table: the step, then each stage's compute per step."""
    if calibration is None:
        return html.Div(waiting, className="ps-empty", id="runs-fidelity-waiting")
    rows = [_row("step", calibration["step_ms"])]
    rows += [_row(f"stage {s['stage']} compute", s) for s in calibration["stage_busy_ms"]]
    children = [
        html.Div(
            headline(calibration, samples_per_step),
            id="runs-fidelity-headline",
            className="ps-prediction",
        ),
        table(FIDELITY_COLUMNS, rows, "Nothing measured yet.", "runs-fidelity-table"),
    ]
    between = engine_text(calibration)
    if between:
        children.append(html.Div(between, id="runs-fidelity-engine", className="ps-hint"))
    return html.Div(children)


def engine_text(calibration: dict[str, Any]) -> str:
    """What the calibrated prediction adds that no op of the profile holds: the engine's
    time between two ops, and the waits for a core on a host with more ranks than cores
    (empty when neither was measured)."""
    parts = []
    overhead = calibration.get("op_overhead_ms") or 0.0
    if overhead > 0:
        parts.append(
            f"Between two ops the engine spent {overhead:.2f} ms; the calibrated "
            "prediction adds it to every forward, backward and weight-gradient op."
        )
    core_wait = calibration.get("core_wait") or 1.0
    if core_wait > 1.0:
        parts.append(f"Ranks waited for a core between ops: calibrated compute x{core_wait:.2f}.")
    return " ".join(parts)


def _row(label: str, compared: dict[str, Any]) -> dict[str, str]:
    measured = compared["measured"]
    return {
        "": label,
        "measured (ms)": "—" if measured is None else f"{measured:.2f}",
        "predicted (ms)": f"{compared['predicted']:.2f}",
        "measured vs predicted": _percent(compared["predicted_error"]),
        "calibrated (ms)": f"{compared['calibrated']:.2f}",
        "measured vs calibrated": _percent(compared["calibrated_error"]),
    }


def _percent(error: float | None) -> str:
    return "—" if error is None else f"{100 * error:+.1f}%"


def _relative(measured: float, predicted: float | None) -> str:
    if not predicted:
        return "—"
    return f"measured {100 * (measured / predicted - 1):+.1f}%"
