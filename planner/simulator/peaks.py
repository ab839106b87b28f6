"""Devices' peak dense TFLOP/s by precision: the denominator of model FLOP utilisation.

A profile names the device it was measured on (``Profile.device``, e.g. "NVIDIA H100 80GB
HBM3 (cuda:0)"); the first entry of ``PEAK_TFLOPS`` whose key the name contains gives its
peaks, so more specific keys come first. The figures are the vendors' dense (no sparsity)
tensor-core peaks for bf16, fp16 and tf32 and the plain fp32 peak (SXM boards where a board
is not named). A user adds or corrects a device with ``peak_tflops(..., extra={name: {...}})``
(``pipestudio simulate --peak-tflops`` gives one figure for the run's device). CPUs have no
entry: their peak depends on the cores and vector units given to the run, so the profiler
measures it once, before the layers, on the threads it profiles with, and the profile
carries it (``Profile.peak_tflops``, which ``profile_peak`` prefers to the table).
"""

from collections.abc import Mapping

from pipestudio.planner.formats.profile import Profile

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0},
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    "L40": {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10G": {},  # no published figures: unknown rather than A10's
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "V100": {"fp16": 125.0, "fp32": 15.7},
    "T4": {"fp16": 65.0, "fp32": 8.1},
}


def peak_tflops(
    device: str, precision: str, extra: Mapping[str, Mapping[str, float]] | None = None
) -> float | None:
    """The peak TFLOP/s of ``device`` (a profile's device name) in ``precision``; None when
    neither ``extra`` nor the table knows it (or the device lacks that precision)."""
    for table in (extra or {}, PEAK_TFLOPS):
        for key, peaks in table.items():
            if key in device:
                return peaks.get(precision)
    return None


def profile_peak(profile: Profile) -> float | None:
    """The peak a profile was measured against: its own measured one, else the table's
    for its device and precision."""
    return profile.peak_tflops or peak_tflops(profile.device, profile.precision)


def model_flop_utilisation(
    model_tflops: float, num_devices: int, peak: float | None
) -> float | None:
    """The model's achieved TFLOP/s over what ``num_devices`` devices of ``peak`` could
    do; None without a peak."""
    if peak is None or peak <= 0 or num_devices < 1:
        return None
    return model_tflops / (num_devices * peak)
