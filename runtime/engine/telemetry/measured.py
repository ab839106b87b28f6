"""A measured run in the simulator's terms: the ``summary`` event and a SimResult whose
timeline is the measured one, so ``pipestudio.planner.simulator.trace`` draws it like a prediction.

Steps are cut as the simulator cuts them: a step ends when its last op (of any worker)
ends, and the first begins with the run's first op, so ``step_times_ms`` compare one to one.
Per stage: ``busy_ms`` is the forwards', backwards' and updates' time per step (mean over
replicas; recomputes lie inside backwards), ``recompute_ms`` and ``swap_bytes`` per step,
``peak_bytes`` the largest measured peak (CUDA: ``max_memory_allocated``; CPU: the
process's peak resident set, which includes the interpreter and libraries). The memory
breakdown holds what the engine can count: weights, stashed versions, gradients and
optimizer state from the tensors, the rest of the peak as activations; there is no device
limit, so ``fits`` is true.
"""

from itertools import pairwise
from typing import Any

from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.result import (
    MemoryBreakdown,
    MemoryTrack,
    SimResult,
    StageResult,
    TimelineOp,
)

_COMPUTE = ("forward", "backward", "update")


def _step_bounds(reports: list[dict[str, Any]], steps: list[int]) -> list[float]:
    ops = [op for report in reports for op in report["timeline"]]
    step_end = {
        step: max((op["end_ms"] for op in ops if op["step"] == step), default=0.0) for step in steps
    }
    first = min((op["start_ms"] for op in ops), default=0.0)
    return [first, *(step_end[step] for step in steps)]


def summary_event(plan: Plan, reports: list[dict[str, Any]], steps: list[int]) -> dict[str, Any]:
    """The ``summary`` event: per-step time and loss, throughput, per-stage figures."""
    bounds = _step_bounds(reports, steps)
    step_times = [later - earlier for earlier, later in pairwise(bounds)]
    total_ms = bounds[-1] - bounds[0]
    samples = plan.num_microbatches * plan.microbatch_size * len(steps)
    losses: dict[int, float] = {}
    for report in reports:
        for event in report["steps"]:
            if "loss" in event:
                losses[event["step"]] = losses.get(event["step"], 0.0) + event["loss"]
    result = measured_result(plan, reports, steps)
    return {
        "type": "summary",
        "steps": steps,
        "step_times_ms": step_times,
        "step_time_ms": total_ms / len(steps) if steps else 0.0,
        "samples_per_s": samples / total_ms * 1e3 if total_ms > 0 else 0.0,
        "loss": [losses.get(step) for step in steps],
        "bubble_fraction": result.bubble_fraction,
        "stages": [
            {
                "index": stage.index,
                "busy_ms": stage.busy_ms,
                "recompute_ms": stage.recompute_ms,
                "swap_bytes": stage.swap_bytes,
                "peak_bytes": stage.peak_bytes,
                "num_weight_versions": stage.num_weight_versions,
            }
            for stage in result.stages
        ],
    }


def _stage_result(
    plan: Plan, stage_idx: int, reports: list[dict[str, Any]], num_steps: int, devices: list[int]
) -> StageResult:
    mine = sorted((r for r in reports if r["stage"] == stage_idx), key=lambda r: r["replica"])

    def per_step(kinds: tuple[str, ...], field: str | None = None) -> float:
        total = sum(
            (op.get("bytes", 0) if field else op["end_ms"] - op["start_ms"])
            for report in mine
            for op in report["timeline"]
            if op["op"] in kinds
        )
        return total / len(mine) / max(num_steps, 1)

    peak = max((m["peak_bytes"] for r in mine for m in r["memory"]), default=0)
    params = max(r["param_bytes"] for r in mine)
    versions = max(r["max_weight_versions"] for r in mine)
    optimizer = max(r["optimizer_bytes"] for r in mine)
    static = params * (2 + versions) + optimizer
    memory = MemoryBreakdown(
        weights_bytes=params,
        weight_versions_bytes=params * versions,
        gradients_bytes=params,
        optimizer_bytes=optimizer,
        activations_bytes=max(0, peak - static),
        workspace_bytes=0,
        total_bytes=max(peak, static),
    )
    return StageResult(
        index=stage_idx,
        layers=list(plan.stages[stage_idx].layers),
        replicas=len(mine),
        devices=devices,
        busy_ms=per_step(_COMPUTE),
        recompute_ms=per_step(("recompute",)),
        swap_bytes=int(per_step(("swap_out",), "bytes")),
        peak_bytes=max(peak, static),
        memory=memory,
        device_memory_bytes=None,
        fits=True,
        max_inflight_microbatches=max(_max_inflight(r["timeline"]) for r in mine),
        num_weight_versions=versions,
    )


def _max_inflight(timeline: list[dict[str, Any]]) -> int:
    count = peak = 0
    for op in sorted(timeline, key=lambda op: op["start_ms"]):
        if op["op"] in ("forward", "backward"):
            count += 1 if op["op"] == "forward" else -1
            peak = max(peak, count)
    return peak


def measured_result(plan: Plan, reports: list[dict[str, Any]], steps: list[int]) -> SimResult:
    """The run as a SimResult (see the module docstring)."""
    bounds = _step_bounds(reports, steps)
    step_time = (bounds[-1] - bounds[0]) / len(steps) if steps else 0.0
    devices = plan.worker_devices()
    stages = [
        _stage_result(plan, idx, reports, len(steps), devices[idx])
        for idx in range(plan.num_stages)
    ]
    busy = sum(stage.busy_ms for stage in stages)
    timeline = sorted(
        (
            TimelineOp.model_validate({k: v for k, v in op.items() if k != "type"})
            for report in reports
            for op in report["timeline"]
        ),
        key=lambda op: (op.start_ms, op.stage, op.replica),
    )
    tracks = [
        MemoryTrack(
            stage=r["stage"],
            replica=r["replica"],
            times_ms=[m["time_ms"] for m in r["memory"]],
            bytes=[m["peak_bytes"] for m in r["memory"]],
        )
        for r in reports
    ]
    samples = plan.num_microbatches * plan.microbatch_size
    return SimResult(
        model=plan.model,
        schedule=plan.schedule,
        num_stages=plan.num_stages,
        num_microbatches=plan.num_microbatches,
        microbatch_size=plan.microbatch_size,
        num_steps=len(steps),
        step_time_ms=step_time,
        step_times_ms=[b - a for a, b in pairwise(bounds)],
        samples_per_s=samples / step_time * 1e3 if step_time > 0 else 0.0,
        bubble_fraction=max(0.0, 1 - busy / (_devices(plan, stages) * step_time))
        if step_time
        else 0.0,
        fits=True,
        window_start_ms=bounds[0],
        window_end_ms=bounds[-1],
        stages=stages,
        timeline=timeline,
        memory_timeline=tracks,
    )


def _devices(plan: Plan, stages: list[Any]) -> int:
    """What runs the stages at once: one device per stage (its busy time is the mean over
    its replicas), or per interleaved rank, which holds several chunks."""
    return plan.num_workers if plan.interleaved else len(stages)
