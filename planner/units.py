"""Units: parsing and printing byte sizes, and converting bandwidths.

Times are milliseconds and sizes bytes everywhere in PipeStudio; bandwidths are given by
people in gigabits per second (as network links are sold) and converted here once.
"""

import math
import re

from pipestudio.planner.errors import PlannerError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a size like ``16GiB``, ``1.5GB``, ``512MiB`` or ``1000`` into bytes."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise PlannerError(
            f"size {text!r} is not understood: expected a number with an optional unit "
            "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB (for example 16GiB)"
        )
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(value):
        raise PlannerError(f"size {text!r} is not finite")
    return round(value)


def format_bytes(num_bytes: float) -> str:
    """Print a byte count with a binary unit, e.g. ``1.50 GiB``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def gbps_to_bytes_per_ms(bandwidth_gbps: float) -> float:
    """Gigabits per second to bytes per millisecond (1 Gbit/s = 125,000 bytes/ms)."""
    return bandwidth_gbps * 1e9 / 8 / 1e3


def transfer_ms(num_bytes: float, bandwidth_gbps: float | None) -> float:
    """Time to move ``num_bytes`` over a link; ``None`` bandwidth means a free link."""
    if bandwidth_gbps is None or num_bytes == 0:
        return 0.0
    return num_bytes / gbps_to_bytes_per_ms(bandwidth_gbps)
