"""Chrome trace export of a simulated (or measured) timeline.

The JSON opens in Perfetto (ui.perfetto.dev) and chrome://tracing: one process per worker,
threads for its compute stream, outgoing transfers and swap, and a memory counter.
"""

import json
from typing import Any

from pipestudio.planner.formats.result import COMPUTE_OPS, SimResult

_THREADS = {"compute": 0, "send": 1, "swap": 2, "allreduce": 3}


def _thread(op: str) -> str:
    if op in COMPUTE_OPS:
        return "compute"
    if op.startswith("send_"):
        return "send"
    if op.startswith("swap_"):
        return "swap"
    return "allreduce"


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """Trace Event Format (microseconds), with process and thread names."""
    events: list[dict[str, Any]] = []
    workers = sorted(
        {(op.stage, op.replica) for op in result.timeline}
        | {(track.stage, track.replica) for track in result.memory_timeline}
    )
    pid = {worker: idx for idx, worker in enumerate(workers)}
    for (stage_idx, replica), worker_pid in pid.items():
        devices = result.stages[stage_idx].devices
        label = f"stage {stage_idx} replica {replica} (device {devices[replica]})"
        events.append(
            {"ph": "M", "name": "process_name", "pid": worker_pid, "args": {"name": label}}
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": worker_pid,
                "args": {"sort_index": worker_pid},
            }
        )
        for thread, tid in _THREADS.items():
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": worker_pid,
                    "tid": tid,
                    "args": {"name": thread},
                }
            )
    for op in result.timeline:
        args: dict[str, Any] = {"step": op.step}
        if op.microbatch is not None:
            args["microbatch"] = op.microbatch
        if op.bytes is not None:
            args["bytes"] = op.bytes
        if op.peer_stage is not None:
            args["peer"] = f"stage {op.peer_stage} replica {op.peer_replica}"
        name = op.op if op.microbatch is None else f"{op.op} {op.microbatch}"
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": op.op,
                "pid": pid[(op.stage, op.replica)],
                "tid": _THREADS[_thread(op.op)],
                "ts": op.start_ms * 1e3,
                "dur": (op.end_ms - op.start_ms) * 1e3,
                "args": args,
            }
        )
    for track in result.memory_timeline:
        for time_ms, num_bytes in zip(track.times_ms, track.bytes, strict=True):
            events.append(
                {
                    "ph": "C",
                    "name": "memory",
                    "pid": pid[(track.stage, track.replica)],
                    "ts": time_ms * 1e3,
                    "args": {"MiB": num_bytes / 2**20},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "model": result.model,
            "schedule": result.schedule,
            "step_time_ms": result.step_time_ms,
        },
    }


def write_chrome_trace(result: SimResult, path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(chrome_trace(result), handle)
