"""The schedule diagrams in planner/simulator/schedule.py are what the simulator does."""

from typing import Any

import pytest

from pipestudio.planner import Profile, SimResult, simulate
from pipestudio.planner.formats.plan import plan_template
from pipestudio.planner.simulator import schedule
from pipestudio.planner.simulator.schedule import (
    interleaved_order,
    worker_order,
    zero_bubble_order,
)
from tests.planner.helpers import chain_profile, even_plan, single_level_cluster


def render(schedule_name: str, num_stages: int = 4, num_mb: int = 8) -> list[str]:
    """One row per stage, one cell per time unit (forward = backward = 1 ms)."""
    profile = chain_profile(num_stages, fwd_ms=1.0, bwd_ms=1.0)
    result = simulate(profile, even_plan(profile, num_stages, num_mb, schedule_name))
    cells = [[".."] * round(result.step_time_ms) for _ in range(num_stages)]
    for op in result.timeline:
        if op.op in ("forward", "backward"):
            cells[op.stage][round(op.start_ms)] = op.op[0].upper() + str(op.microbatch)
    return [f"stage {idx}  " + " ".join(row) for idx, row in enumerate(cells)]


def docstring_block(title: str, rows: int = 4) -> list[str]:
    lines = [line.strip() for line in (schedule.__doc__ or "").splitlines()]
    start = next(idx for idx, line in enumerate(lines) if line.startswith(title))
    return lines[start + 1 : start + 1 + rows]


@pytest.mark.parametrize("name,title", [("gpipe", "gpipe"), ("1f1b", "1f1b (and pipedream")])
def test_docstring_diagram_matches_simulation(name: str, title: str) -> None:
    assert render(name) == docstring_block(title)


def test_1f1b_order_warmup_steady_drain() -> None:
    assert worker_order("1f1b", [0, 1, 2, 3], 2) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("F", 3),
        ("B", 1),
        ("B", 2),
        ("B", 3),
    ]
    assert worker_order("1f1b", [0, 1], 5) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert worker_order("gpipe", [0, 1, 2], 0) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 2),
        ("B", 1),
        ("B", 0),
    ]


def test_warmup_counts_follow_pipedream_runtime() -> None:
    """(workers in this and later stages - 1) // replicas of this stage."""
    profile = chain_profile(4)
    plan = even_plan(profile, 3, 4, "pipedream", replicas=[2, 1, 1])
    assert [plan.warmup_forwards(s) for s in range(3)] == [(4 - 1) // 2, 1, 0]


def _cells(result: SimResult, rows: int, row_of: Any, label: Any) -> list[list[str]]:
    """The measured step's compute ops (these schedules simulate a step before it)."""
    cells = [[".."] * round(result.step_time_ms) for _ in range(rows)]
    step = result.timeline[-1].step
    first = result.num_microbatches * step
    for op in result.timeline:
        if op.op in ("forward", "backward", "weight") and op.step == step:
            start = op.start_ms - result.window_start_ms
            for cell in range(round(start), round(start + op.end_ms - op.start_ms)):
                cells[row_of(op.stage)][cell] = label(
                    op.model_copy(update={"microbatch": (op.microbatch or 0) - first})
                )
    return cells


def split_profile(num_layers: int) -> Profile:
    """F = 1, B = 1 and W = 1 ms per layer (a backward of 2 ms, half of it the weights')."""
    profile = chain_profile(num_layers, fwd_ms=1.0, bwd_ms=2.0)
    layers = [layer.model_copy(update={"bwd_weight_ms": 1.0}) for layer in profile.layers]
    return profile.model_copy(update={"layers": layers})


def test_zero_bubble_diagram_matches_simulation() -> None:
    profile = split_profile(4)
    result = simulate(profile, plan_template(profile, 4, 8, "zero-bubble"))
    kinds = {"forward": "F", "backward": "B", "weight": "W"}
    cells = _cells(result, 4, lambda s: s, lambda op: kinds[op.op] + str(op.microbatch))
    rows = [f"stage {idx}  " + " ".join(row) for idx, row in enumerate(cells)]
    assert rows == docstring_block("zero-bubble")


def test_interleaved_diagram_matches_simulation() -> None:
    profile = chain_profile(4, fwd_ms=1.0, bwd_ms=1.0)
    plan = plan_template(profile, 2, 4, "interleaved-1f1b", virtual_stages=2)
    result = simulate(profile, plan)
    cells = _cells(
        result,
        2,
        lambda s: s % 2,
        lambda op: op.op[0].upper() + "ab"[op.stage // 2] + str(op.microbatch),
    )
    rows = [f"device {idx}  " + " ".join(row) for idx, row in enumerate(cells)]
    assert rows == docstring_block("interleaved-1f1b", rows=2)


@pytest.mark.parametrize(
    "devices,chunks,microbatches", [(2, 2, 4), (4, 2, 8), (4, 4, 4), (2, 3, 2), (3, 2, 9)]
)
def test_interleaved_bubble_is_1f1b_over_the_chunks(
    devices: int, chunks: int, microbatches: int
) -> None:
    """Equal ops: 1F1B's step is (m + p - 1)(f + b), interleaved's (m + (p - 1) / v)(f + b),
    so its bubble is (p - 1) / (v m) of the work."""
    profile = chain_profile(devices * chunks, fwd_ms=1.0, bwd_ms=2.0)
    work = 3.0 * chunks  # a device's forward and backward of one micro-batch
    flat = simulate(profile, plan_template(profile, devices, microbatches, "1f1b"))
    assert flat.step_time_ms == pytest.approx((microbatches + devices - 1) * work)
    interleaved = simulate(
        profile,
        plan_template(profile, devices, microbatches, "interleaved-1f1b", virtual_stages=chunks),
    )
    assert interleaved.step_time_ms == pytest.approx((microbatches + (devices - 1) / chunks) * work)
    ideal = microbatches * work
    assert interleaved.step_time_ms / ideal - 1 == pytest.approx(
        (devices - 1) / (chunks * microbatches)
    )
    # the bubble is the devices' idle time, each device holding ``chunks`` stages
    assert interleaved.bubble_fraction == pytest.approx(1 - ideal / interleaved.step_time_ms)
    assert flat.bubble_fraction == pytest.approx(1 - ideal / flat.step_time_ms)


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 6), (4, 4), (4, 8), (5, 7)])
def test_zero_bubble_bubble_is_a_third_of_1f1b_with_equal_f_b_w(
    stages: int, microbatches: int
) -> None:
    """F = B = W: 1F1B takes 3 (m + p - 1) cells, ZB-H1 3 m + p - 1."""
    profile = split_profile(stages)
    flat = simulate(profile, plan_template(profile, stages, microbatches, "1f1b"))
    assert flat.step_time_ms == pytest.approx(3 * (microbatches + stages - 1))
    zb = simulate(profile, plan_template(profile, stages, microbatches, "zero-bubble"))
    assert zb.step_time_ms == pytest.approx(3 * microbatches + stages - 1)
    # the peak stage holds what 1F1B's first stage holds; later stages hold more than in
    # 1F1B (the inputs of their deferred weight halves), never more than that
    peaks_1f1b = [stage.peak_bytes for stage in flat.stages]
    peaks_zb = [stage.peak_bytes for stage in zb.stages]
    assert max(peaks_zb) == max(peaks_1f1b) and peaks_zb[0] == peaks_1f1b[0]
    assert all(b >= a for a, b in zip(peaks_1f1b, peaks_zb, strict=True))


def test_the_orders_cover_every_op_once() -> None:
    microbatches = list(range(8))
    for device in range(4):
        order = interleaved_order(device, 4, 2, microbatches)
        assert sorted(order) == sorted(
            (kind, chunk, mb) for kind in "FB" for chunk in range(2) for mb in microbatches
        )
    for delay in range(4):
        order = zero_bubble_order(microbatches, 3 - delay, delay)
        assert sorted(order) == sorted((kind, mb) for kind in "FBW" for mb in microbatches)
        # a weight half never comes before its input half
        assert all(order.index(("W", mb)) > order.index(("B", mb)) for mb in microbatches)


def test_an_interleaved_device_holds_its_chunks_together() -> None:
    """A device's peak is its chunks' memory summed over time; a cap between the largest
    chunk's peak and that does not fit, though every chunk alone would."""
    profile = chain_profile(8, fwd_ms=1.0, bwd_ms=2.0, saved_bytes=1000, param_bytes=10_000)
    plan = plan_template(profile, 2, 4, "interleaved-1f1b", virtual_stages=2)
    free = simulate(profile, plan)
    chunks = [stage.peak_bytes for stage in free.stages]
    assert len(free.device_peak_bytes) == 2
    for device in (0, 1):
        mine = [peak for stage, peak in enumerate(chunks) if stage % 2 == device]
        assert max(mine) < free.device_peak_bytes[device] <= sum(mine)
    cap = max(chunks) + 1
    assert cap < free.largest_peak_bytes
    capped = simulate(profile, plan, single_level_cluster(2, memory=cap))
    assert not capped.fits
    just = simulate(profile, plan, single_level_cluster(2, memory=free.largest_peak_bytes))
    assert just.fits
