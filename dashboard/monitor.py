"""What the runs page reads and draws: a run's measured steps, memory, ops, migrations and
proposals, fetched over REST at every tick of the live monitor.

Migrations are placed at the last step whose metrics the backend had received when the
migration was recorded (both carry the backend's clock), so their markers land where the
run's figures change.
"""

import bisect
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from pipestudio.dashboard.api import ApiClient, ApiError
from pipestudio.dashboard.components.fidelity import samples_per_s
from pipestudio.dashboard.components.gantt import ops_gantt
from pipestudio.dashboard.components.run_charts import (
    Marker,
    loss_figure,
    run_memory_figure,
    stage_busy_figure,
    swap_recompute_figure,
    throughput_figure,
)
from pipestudio.dashboard.components.style import Figure
from pipestudio.planner.formats.plan import Plan

#: Event kinds that mark a repartition of the running job.
MIGRATION_KINDS = ("migration", "migration_requested")


@dataclass
class RunView:
    """Everything the live monitor shows of one run."""

    run: dict[str, Any]
    plan: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    proposals: list[dict[str, Any]] = field(default_factory=list)
    #: ``GET /api/runs/{id}/calibrated-profile`` (None until the run measured enough).
    calibration: dict[str, Any] | None = None

    @property
    def samples_per_step(self) -> int:
        document = self.plan["document"]
        return int(document["num_microbatches"]) * int(document["microbatch_size"])


#: How the backend stores what JSON has no number for (a diverging loss); read back as the
#: floats they are, which the charts draw as gaps.
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def flatten(metric: dict[str, Any]) -> dict[str, Any]:
    """A stored metric as the engine's event: its data, with stage, replica and step."""
    event = {
        key: NON_FINITE.get(value, value) if isinstance(value, str) else value
        for key, value in (metric.get("data") or {}).items()
    }
    for key in ("stage", "replica", "step"):
        if event.get(key) is None and metric.get(key) is not None:
            event[key] = metric[key]
    event.setdefault("replica", 0)
    event["received_at"] = metric.get("received_at")
    return event


def migration_markers(events: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[Marker]:
    """A marker per migration: where it was requested (the last step received before the
    request was recorded) and where it took effect (the engine's step, once that step was
    measured: a migration scheduled for a later step is not drawn before it comes)."""
    received = sorted((str(e.get("received_at")), e["step"]) for e in steps if e.get("received_at"))
    times = [time for time, _ in received]
    last = max((e["step"] for e in steps), default=-1)
    markers = []
    for event in events:
        if event["kind"] not in MIGRATION_KINDS:
            continue
        step = event.get("step")
        if step is None:
            idx = bisect.bisect_right(times, str(event["created_at"])) - 1
            step = max((s for _, s in received[: idx + 1]), default=0)
        elif step > last:
            continue  # not reached yet
        data = event.get("data") or {}
        # the backend's request, a worker's answer to it (before the switch: scheduled),
        # or the engine's report of the switch at its step
        verb = (
            "requested"
            if event["kind"] == "migration_requested"
            else "failed"
            if not data.get("ok", True)
            else "scheduled"
            if event.get("step") is None
            else "migrated"
        )
        moves = data.get("moves") or (data.get("payload") or {}).get("moves") or []
        text = (
            (f"migration {verb}" if verb != "migrated" else verb)
            + ": "
            + (
                ", ".join(f"{m['layer']} {m['from_stage']}→{m['to_stage']}" for m in moves[:3])
                or event.get("message")
                or ""
            )
        )
        label = verb
        markers.append(Marker(step + 0.5, text[:200], f"⇄ {label} (step {step})"))
    return merge_markers(markers)


def merge_markers(markers: list[Marker]) -> list[Marker]:
    """One marker per step: every worker reports a migration's outcome, and a request and
    its outcome often land on the same step."""
    texts: dict[float, list[str]] = {}
    labels: dict[float, list[str]] = {}
    for marker in markers:
        if marker.text not in texts.setdefault(marker.step, []):
            texts[marker.step].append(marker.text)
        if marker.label and marker.label not in labels.setdefault(marker.step, []):
            labels[marker.step].append(marker.label)
    return [
        Marker(step, "<br>".join(found), ", ".join(labels.get(step, [])))
        for step, found in texts.items()
    ]


def latest_attempts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per worker and step, in step order, from the latest attempt that reported
    it: a run that resumed from a checkpoint runs again the steps its failed attempt had
    got past, and each attempt's clock starts at 0, so both records of a step cannot be
    drawn together."""
    kept: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for event in events:
        key = (event.get("stage"), event.get("replica", 0), event.get("step"))
        if key not in kept or event.get("attempt", 0) >= kept[key].get("attempt", 0):
            kept[key] = event
    return sorted(kept.values(), key=lambda e: (e["step"], e["stage"], e.get("replica", 0)))


def measured_steps(
    client: ApiClient, run_id: int, kind: str, max_points: int = 5000
) -> list[dict[str, Any]]:
    """The run's ``step`` or ``memory`` metrics as engine events, one per worker and step
    (``latest_attempts``)."""
    return latest_attempts(
        [flatten(m) for m in client.metrics(run_id, [kind], max_points=max_points)]
    )


def complete_step(steps: list[dict[str, Any]]) -> int | None:
    """The newest step that every worker (stage, replica) has reported the end of: the
    newest step of all may hold the ops of only the workers that finished it first."""
    workers = {(e["stage"], e.get("replica", 0)) for e in steps}
    reported: dict[int, set[tuple[Any, Any]]] = {}
    for event in steps:
        reported.setdefault(event["step"], set()).add((event["stage"], event.get("replica", 0)))
    return max((step for step, seen in reported.items() if seen == workers), default=None)


def last_step_ops(ops: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The ops of ``step``, from the latest attempt that ran it."""
    ops = [op for op in ops if op["step"] == step]
    if not ops:
        return []
    attempt = max(op.get("attempt", 0) for op in ops)
    return [op for op in ops if op.get("attempt", 0) == attempt]


def fetch_view(client: ApiClient, run_id: int) -> RunView:
    run = client.run(run_id)
    plan = client.plan(run["plan_id"])
    view = RunView(run, plan)
    view.steps = measured_steps(client, run_id, "step", max_points=2000)
    view.memory = measured_steps(client, run_id, "memory", max_points=2000)
    step = complete_step(view.steps)
    if step is not None:
        since = min(e["start_ms"] for e in view.steps if e["step"] == step)
        ops = [flatten(m) for m in client.metrics(run_id, ["op"], start_ms=since, max_points=20000)]
        view.ops = last_step_ops(ops, step)
    view.events = client.events(run_id)
    view.markers = migration_markers(view.events, view.steps)
    view.proposals = client.proposals(run_id)
    view.calibration = _calibration(client, run_id, view.run["state"])
    return view


#: run id -> (monotonic time, run state, calibration): calibrating costs the backend
#: three simulations, so a live run is calibrated again at most every CALIBRATE_EVERY_S,
#: and an ended one once.
_CALIBRATED: dict[int, tuple[float, str, dict[str, Any] | None]] = {}
CALIBRATE_EVERY_S = 5.0
LIVE_STATES = ("starting", "running", "resuming")


def _calibration(client: ApiClient, run_id: int, state: str) -> dict[str, Any] | None:
    now = time.monotonic()
    known = _CALIBRATED.get(run_id)
    if (
        known is not None
        and known[1] == state
        and (state not in LIVE_STATES or now - known[0] < CALIBRATE_EVERY_S)
    ):
        return known[2]
    try:
        calibration: dict[str, Any] | None = client.calibrated_profile(run_id)
    except ApiError as exc:
        if exc.status != 409:
            raise
        calibration = None  # nothing measured to calibrate from yet
    _CALIBRATED[run_id] = (now, state, calibration)
    return calibration


def chunk_devices(document: dict[str, Any]) -> dict[int, int] | None:
    """Under ``interleaved-1f1b``, the device of each chunk (``Plan.rank_of_stage``);
    None for the schedules that give each stage its own device."""
    if document.get("schedule") != "interleaved-1f1b":
        return None
    plan = Plan.model_validate(document)
    return {chunk: plan.rank_of_stage(chunk) for chunk in range(plan.num_stages)}


def figures(view: RunView) -> list[Figure]:
    """[measured Gantt, throughput, compute per stage, memory, recompute/swap, loss]."""
    summary = view.plan.get("summary") or {}
    limits = dict(enumerate(summary.get("stage_device_memory_bytes") or []))
    step = view.ops[0]["step"] if view.ops else None
    gantt = ops_gantt(
        view.ops,
        f"Measured schedule of step {step}" if step is not None else "Measured schedule",
        empty_message="Waiting for the first measured step…",
        device_of_stage=chunk_devices(view.plan["document"]),
    )
    return [
        gantt,
        throughput_figure(
            view.steps, view.markers, summary.get("samples_per_s"), _calibrated_rate(view)
        ),
        stage_busy_figure(view.steps, view.markers),
        run_memory_figure(view.memory, limits, view.markers),
        swap_recompute_figure(view.steps, view.markers),
        loss_figure(view.steps, view.markers),
    ]


def _calibrated_rate(view: RunView) -> float | None:
    if view.calibration is None:
        return None
    return samples_per_s(view.calibration["step_ms"]["calibrated"], view.samples_per_step)


def progress(view: RunView) -> tuple[int, float | None]:
    """Steps done (steps count from 0, so ``last_step + 1``) and the measured steps per
    second over the latest steps (None before two steps were measured)."""
    run = view.run
    done = 0 if run.get("last_step") is None else int(run["last_step"]) + 1
    if run["state"] == "finished":
        done = int(run["steps"])
    spans: dict[int, float] = {}
    for event in view.steps:
        spans[event["step"]] = max(spans.get(event["step"], 0.0), event["end_ms"])
    ends = [spans[step] for step in sorted(spans)][-11:]
    rate = (
        (len(ends) - 1) / (ends[-1] - ends[0]) * 1e3
        if len(ends) > 1 and ends[-1] > ends[0]
        else None
    )
    return min(done, int(run["steps"])), rate


def progress_text(view: RunView) -> str:
    """``37 of 50 steps (74%) · 2.1 steps/s · about 6 s left`` (as far as it is known)."""
    done, rate = progress(view)
    total = int(view.run["steps"])
    text = f"{done} of {total} steps ({done / total:.0%})"
    if rate and view.run["state"] in ("running", "starting"):
        text += f" · {rate:.2g} steps/s · about {_duration((total - done) / rate)} left"
    return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def status_text(view: RunView) -> str:
    """The run's state and why it ended; and how many worker messages the backend
    rejected (it could not store them: a stranger's, or malformed), with the latest."""
    run = view.run
    text = (
        f"Run {run['id']} of plan {run['plan_id']} ({run['model']}): {run['state']}, "
        f"{progress_text(view)}, {len(run.get('ranks') or [])} ranks"
    )
    text += f" — {run['message']}" if run.get("message") else ""
    rejected = [e for e in view.events if e["kind"] == "rejected"]
    if rejected:
        text += (
            f" · {len(rejected)} worker message(s) rejected, the latest: "
            f"{rejected[-1].get('message', '')}"
        )
    return text


def measured_trace(ops: list[dict[str, Any]], run_id: int) -> str:
    """Chrome trace (Trace Event Format, microseconds) of measured ops: one process per
    stage replica, one thread per stream, as ``pipestudio.planner.simulator.trace`` draws
    predictions."""
    threads = {"compute": 0, "send": 1, "swap": 2, "allreduce": 3}
    workers = sorted({(op["stage"], op.get("replica", 0)) for op in ops})
    pid = {worker: idx for idx, worker in enumerate(workers)}
    events: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": idx,
            "args": {"name": f"stage {stage} replica {replica}"},
        }
        for (stage, replica), idx in pid.items()
    ]
    for op in ops:
        kind = op["op"]
        thread = (
            "send"
            if kind.startswith("send_")
            else "swap"
            if kind.startswith("swap_")
            else "allreduce"
            if kind == "allreduce"
            else "compute"
        )
        events.append(
            {
                "ph": "X",
                "name": kind if op.get("microbatch") is None else f"{kind} {op['microbatch']}",
                "cat": kind,
                "pid": pid[(op["stage"], op.get("replica", 0))],
                "tid": threads[thread],
                "ts": op["start_ms"] * 1e3,
                "dur": (op["end_ms"] - op["start_ms"]) * 1e3,
                "args": {"step": op["step"]},
            }
        )
    return json.dumps(
        {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"run_id": run_id, "measured": True},
        }
    )
