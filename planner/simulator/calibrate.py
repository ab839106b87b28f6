"""Calibration: the profile (and the links) a run's measurements say the plan really has.

The engine times every op of every stage replica (``op`` events, docs/runtime.md). The
simulator predicts the same ops from the profile (its timeline), so each measured op has a
predicted twin and their ratio says how far the profile is off on this machine, with these
threads, under this load. Per stage, over the steps chosen:

- forward: f = measured mean forward / predicted mean forward;
- backward: the engine times a recompute inside its backward, the simulator apart, as
  the forward of the recomputed layers; so the calibrated recompute is f x the predicted
  one and b = (measured mean backward - f x predicted recompute) / predicted mean backward
  proper, which keeps the measured sum of the two;
- update: u = measured mean update / predicted mean update; where the profile predicts no
  update but the run took time, that time is shared among the stage's layers by parameter
  bytes, as ``runtime/engine/telemetry/observe.py`` does.

Between two compute ops a worker also spends time no op event holds: posting the previous
op's sends (gloo copies in the caller when the receiver is ready), posting receives,
sampling data, Python. ``op_overhead_ms`` measures it where no waiting can hide in it
(before the first stage's forwards and the last stage's backwards), and the calibrated
profile carries it as ``Profile.op_overhead_ms``, which the simulator adds to every
forward, backward and weight-gradient op: it is paid once per op, so a schedule with more,
shorter ops (interleaved chunks, zero-bubble's split backwards) pays it more often than
the run calibrated from, which a per-stage factor would not say. The factors above compare
the measured ops with the predicted ones less the overhead the profile already had.

Ranks that shared a host's cores (more ranks than the host has cores for their threads)
or a GPU (``Sharing`` says where each ran: the run's ``start`` events tell) computed slower
while their mates computed too. The
prediction from the profile places them on the host's compute slots
(``placement.shared_placement``); the calibrated one does not, since the measured op times
already hold what sharing cost (counting the sharing by the ops' work and simulating the
shared slots instead was tried: it ties two stages to one core for the whole run, where the
operating system lets the busier ones have more, and missed 4-stage runs on 2 cores by up
to 23%). What the op times do not hold is a rank's wait for a core between two ops (its
next op ready, both cores busy): the calibrated compute grows by the one factor
(``core_wait``, at least 1) that makes the simulated step the measured mean step over the
calibration's steps, on such runs only.

Every layer of the stage gets fwd_ms x f, bwd_ms x b, update_ms x u: the calibrated profile
keeps the profile's split of work among layers and takes the run's total for each stage.
Memory is left as profiled (the engine measures a process's peak, not the tensors a plan
keeps).

Links. A transfer's end as the sender sees it bounds the transfer from above only (the
sender checks after its next op), so the receiver's side is read instead: the receiving
forward (activation) or backward (gradient) starts once the tensor is there, so when the
receiver was idle from before the send started, the gap from the send's start to that op's
start is the transfer as the run felt it. Per level of the cluster the links cross, the
bandwidth that makes the median such gap is the calibrated bandwidth (bytes / time; on CPU
this folds gloo's latency in at the sizes the run sends), counting for each send the bytes
the simulator moves for it (the profile's, ``_link_gbps``). A level no idle receiver
measured keeps its bandwidth.
"""

import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from pipestudio.planner.errors import PlannerError
from pipestudio.planner.formats.cluster import Cluster, cluster_template
from pipestudio.planner.formats.plan import Plan, resolve_plan
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.formats.result import OpKind
from pipestudio.planner.simulator.costs import boundary_bytes
from pipestudio.planner.simulator.peaks import profile_peak
from pipestudio.planner.simulator.placement import (
    Host,
    crowded_hosts,
    shared_placement,
    started_hosts,
)
from pipestudio.planner.simulator.simulate import ENGINE_OPS, simulate
from pipestudio.planner.units import gbps_to_bytes_per_ms

_KINDS = ("forward", "backward", "weight", "recompute", "update")
#: The backward proper keeps at least this share of the measured backward (a recompute
#: predicted longer than the whole measured backward would otherwise leave it nothing, or
#: less). A share, not a floor on the factor: a profile of a far larger model than the run's
#: (factors of 0.01) is calibrated as faithfully as any.
_MIN_BACKWARD_SHARE = 0.05
_TRANSFERS = {"send_activation": "forward", "send_gradient": "backward"}
#: The ops a run reports (the simulator's timeline kinds); anything else is left out.
_OP_KINDS = frozenset(get_args(OpKind))


class CalibrationError(PlannerError):
    """The measurements cannot calibrate the profile (none of a stage's ops, or not this
    plan's)."""


@dataclass
class StageCalibration:
    """One stage's measured and predicted mean op times (ms) and the factors they give."""

    stage: int
    measured: dict[str, float]
    predicted: dict[str, float]
    factors: dict[str, float]


@dataclass(frozen=True)
class Sharing:
    """The hosts of a run and which one ran each stage replica (``host_of[s][r]``)."""

    hosts: Sequence[Host]
    host_of: Sequence[Sequence[int]]

    @classmethod
    def of_run(cls, plan: Plan, events: Iterable[Mapping[str, Any]]) -> "Sharing | None":
        """Where a run of ``plan`` ran, from its ``start`` events (None: they do not say)."""
        found = started_hosts(plan, events)
        return None if found is None else cls(*found)

    def oversubscribed(self) -> set[tuple[int, int]]:
        """The (stage, replica) pairs on hosts that ran more ranks than they have slots."""
        crowded = crowded_hosts(self.hosts, self.host_of)
        return {
            (stage, replica)
            for stage, hosts in enumerate(self.host_of)
            for replica, host in enumerate(hosts)
            if host in crowded
        }


@dataclass
class Calibration:
    """The calibrated profile and cluster, what each stage measured, and the steps used."""

    profile: Profile
    cluster: Cluster | None
    stages: list[StageCalibration]
    steps: list[int]
    #: Calibrated Gbit/s by cluster level (only the levels the run's transfers measured).
    link_gbps: dict[int, float] = field(default_factory=dict)
    #: Where the run's ranks ran, when some shared a host's cores (``Sharing``).
    sharing: "Sharing | None" = None
    #: How much longer compute takes for the waits for a core between ops (1: none).
    core_wait: float = 1.0

    def placed(self, plan: Plan, cluster: Cluster | None) -> tuple[Plan, Cluster | None]:
        """The plan and cluster to predict the run on from its profile: its ranks on their
        hosts' compute slots when they shared them, else as given."""
        if self.sharing is not None:
            found = shared_placement(plan, cluster, self.sharing.hosts, self.sharing.host_of)
            if found is not None:
                return found
        return plan, cluster

    def summary(self) -> dict[str, Any]:
        return {
            "steps": [self.steps[0], self.steps[-1]] if self.steps else [],
            "stages": [
                {
                    "stage": s.stage,
                    "measured_ms": s.measured,
                    "predicted_ms": s.predicted,
                    "factors": s.factors,
                }
                for s in self.stages
            ],
            "link_gbps": {str(level): gbps for level, gbps in self.link_gbps.items()},
            "op_overhead_ms": self.profile.op_overhead_ms,
            "core_wait": self.core_wait,
        }


def op_events(
    events: Iterable[Mapping[str, Any]], steps: range | None = None
) -> list[dict[str, Any]]:
    """The well-formed ``op`` events (``_is_op``: a worker's malformed report is left out)
    of the latest attempt (a resumed run repeats steps), in ``steps`` when given."""
    ops = [dict(e) for e in events if e.get("type", "op") == "op" and _is_op(e)]
    if ops:
        attempt = max(_attempt(e) for e in ops)
        ops = [e for e in ops if _attempt(e) == attempt]
    if steps is not None:
        ops = [e for e in ops if e["step"] in steps]
    return ops


def calibrate(
    profile: Profile,
    plan: Plan,
    events: Iterable[Mapping[str, Any]],
    cluster: Cluster | None = None,
    steps: range | None = None,
    max_ops: int | None = None,
    sharing: Sharing | None = None,
) -> Calibration:
    """The calibration of the module docstring from a run of ``plan`` on ``cluster``;
    ``steps`` picks the measured steps (default: all but the first, which warms up);
    ``max_ops`` bounds the simulation (``simulate``); ``sharing`` says where the ranks
    ran (``Calibration.placed``)."""
    ops = op_events(events)
    measured_steps = sorted({e["step"] for e in ops})
    if steps is None:
        steps = range(measured_steps[1] if len(measured_steps) > 1 else 0, 1 << 62)
    ops = [e for e in ops if e["step"] in steps]
    if not ops:
        raise CalibrationError(
            f"no op events in steps {_describe(steps)}: calibrate from "
            "a run's metrics (pipestudio train --metrics FILE.jsonl)"
        )
    if max(e["stage"] for e in ops) >= plan.num_stages:
        raise CalibrationError(
            f"the measurements have {max(e['stage'] for e in ops) + 1} "
            f"stages, the plan {plan.num_stages}: give the plan the run "
            "ran"
        )
    predicted = simulate(profile, plan, cluster, num_steps=2, max_ops=max_ops).timeline
    assert predicted is not None
    overhead = op_overhead_ms(ops, plan.num_stages)
    stages = [
        _stage(
            idx,
            [e for e in ops if e["stage"] == idx],
            [_less_overhead(op.model_dump(), profile) for op in predicted if op.stage == idx],
            overhead,
        )
        for idx in range(plan.num_stages)
    ]
    calibrated = _scaled(profile, plan, stages).model_copy(update={"op_overhead_ms": overhead})
    waiting = sharing.oversubscribed() if sharing is not None else set()
    link_gbps = _link_gbps(ops, plan, cluster, overhead, waiting, _profile_bytes(profile, plan))
    new_cluster = _with_links(cluster, plan, link_gbps)
    calibration = Calibration(
        calibrated, new_cluster, stages, sorted({e["step"] for e in ops}), link_gbps, sharing
    )
    if waiting:
        _add_core_waits(calibration, plan, ops, max_ops)
    return calibration


def _add_core_waits(
    calibration: Calibration, plan: Plan, ops: list[dict[str, Any]], max_ops: int | None
) -> None:
    """On a host with more ranks than compute slots, a rank whose next op is ready waits
    for a core; no op event holds that wait, so ops timed alone predict the steps too
    fast. The calibrated profile's compute grows by the one factor (at least 1) that makes
    its simulated step the measured mean step of the calibration's steps."""
    times = list(measured_step_times(ops).values())
    if not times:
        return
    measured = statistics.fmean(times)
    factor, profile = 1.0, calibration.profile
    for _ in range(4):  # the step is nearly proportional to compute: a few rounds settle it
        predicted = simulate(
            profile, plan, calibration.cluster, with_timeline=False, max_ops=max_ops
        ).step_time_ms
        if predicted <= 0 or abs(measured / predicted - 1) < 1e-3:
            break
        factor = max(1.0, factor * measured / predicted)
        profile = _slowed(calibration.profile, factor)
        if factor == 1.0:
            break
    calibration.profile, calibration.core_wait = profile, factor


def _slowed(profile: Profile, factor: float) -> Profile:
    """``profile`` with every layer's forward, backward and update ``factor`` times longer."""
    layers = [
        layer.model_copy(
            update={
                "fwd_ms": layer.fwd_ms * factor,
                **layer.backward_times(factor),
                "update_ms": layer.update_ms * factor,
            }
        )
        for layer in profile.layers
    ]
    metadata = {**profile.metadata, "calibrated_core_wait": f"{factor:.4f}"}
    return profile.model_copy(update={"layers": layers, "metadata": metadata})


def _less_overhead(op: dict[str, Any], profile: Profile) -> dict[str, Any]:
    """A predicted op without the profile's ``op_overhead_ms`` (the compute proper)."""
    if op["op"] in ENGINE_OPS:
        op["end_ms"] = max(op["start_ms"], op["end_ms"] - profile.op_overhead_ms)
    return op


def op_overhead_ms(ops: list[dict[str, Any]], num_stages: int) -> float:
    """What a worker spends between two compute ops when it waits for no one: the median
    gap before the ops that need nothing from another stage (the first stage's forwards,
    the last stage's backwards). That gap posts the previous op's sends
    (gloo copies in the caller when the receiver is ready), posts receives, samples data,
    and runs Python; no op event holds it, and the calibrated profile carries it
    (``Profile.op_overhead_ms``; 0 when the run has no such gap)."""
    by_worker: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for op in ops:
        if op["op"] in ("forward", "backward", "update"):
            by_worker[(op["stage"], op["replica"])].append(op)
    gaps = []
    for (stage, _), mine in by_worker.items():
        mine.sort(key=lambda op: op["start_ms"])
        for before, op in itertools.pairwise(mine):
            local = (op["op"] == "forward" and stage == 0) or (
                op["op"] == "backward" and stage == num_stages - 1
            )
            if local and op["step"] == before["step"]:
                gaps.append(max(0.0, op["start_ms"] - before["end_ms"]))
    return statistics.median(gaps) if gaps else 0.0


def _stage(
    idx: int,
    measured_ops: list[dict[str, Any]],
    predicted_ops: list[dict[str, Any]],
    overhead_ms: float,
) -> StageCalibration:
    measured = _means(measured_ops, recompute_inside=True)
    predicted = _means(predicted_ops, recompute_inside=False)
    for kind in ("forward", "backward"):
        if kind not in measured:
            raise CalibrationError(f"stage {idx} has no measured {kind} in these steps")
    measured["overhead"] = overhead_ms
    forward = _ratio(measured["forward"], predicted.get("forward", 0.0))
    # both backwards hold their recompute (``_means``). The simulator times a recompute as
    # the forward of its layers, so the calibrated one is f x the predicted one, and the
    # backward proper gets the rest of the measured backward: their sum is what the run
    # measured, whatever share of it the recompute really took
    predicted_recompute = predicted.get("recompute", 0.0)
    backward = _ratio(
        max(
            measured["backward"] - forward * predicted_recompute,
            _MIN_BACKWARD_SHARE * measured["backward"],
        ),
        predicted.get("backward", 0.0) - predicted_recompute,
    )
    factors = {
        "forward": forward,
        "backward": backward,
        "update": _ratio(measured.get("update", 0.0), predicted.get("update", 0.0)),
    }
    return StageCalibration(idx, measured, predicted, factors)


def _means(ops: list[dict[str, Any]], recompute_inside: bool) -> dict[str, float]:
    """Mean forward, backward (with its weight half, split: zero-bubble) and update;
    recompute per backward (a backward may hold several recomputed runs).
    ``recompute_inside``: the backward's time holds its recompute (the engine's); else the
    recompute comes before it (the simulator's), and is added, so that both mean the
    same."""
    durations: dict[str, list[float]] = defaultdict(list)
    for op in ops:
        if op["op"] in _KINDS:
            durations[op["op"]].append(op["end_ms"] - op["start_ms"])
    means = {
        kind: statistics.fmean(values)
        for kind, values in durations.items()
        if kind not in ("recompute", "weight")
    }
    if durations.get("weight") and durations.get("backward"):
        # zero-bubble: a backward is its two halves, as the profile's bwd_ms is
        means["backward"] += sum(durations["weight"]) / len(durations["backward"])
    if durations.get("recompute") and durations.get("backward"):
        means["recompute"] = sum(durations["recompute"]) / len(durations["backward"])
        if not recompute_inside:
            means["backward"] += means["recompute"]
    return means


def _ratio(measured: float, predicted: float) -> float:
    return measured / predicted if predicted > 0 else 1.0


def _scaled(profile: Profile, plan: Plan, stages: list[StageCalibration]) -> Profile:
    stage_of = {name: idx for idx, stage in enumerate(plan.stages) for name in stage.layers}
    param_bytes: dict[int, int] = defaultdict(int)
    for layer in profile.layers:
        param_bytes[stage_of[layer.name]] += layer.param_bytes
    layers = []
    for layer in profile.layers:
        stage = stages[stage_of[layer.name]]
        update = layer.update_ms * stage.factors["update"]
        if stage.predicted.get("update", 0.0) == 0 and stage.measured.get("update", 0.0) > 0:
            share = (
                layer.param_bytes / param_bytes[stage.stage]
                if param_bytes[stage.stage]
                else 1 / len(plan.stages[stage.stage].layers)
            )
            update = stage.measured["update"] * share
        layers.append(
            layer.model_copy(
                update={
                    "fwd_ms": layer.fwd_ms * stage.factors["forward"],
                    **layer.backward_times(stage.factors["backward"]),
                    "update_ms": update,
                }
            )
        )
    metadata = {**profile.metadata, "calibrated_from": "run measurements (per-stage op times)"}
    return profile.model_copy(update={"layers": layers, "metadata": metadata})


def _profile_bytes(profile: Profile, plan: Plan) -> dict[tuple[int, int], int]:
    """Bytes per micro-batch the simulator moves from stage a to a later stage c, keyed
    (a, c): the profile's, at the plan's micro-batch size."""
    layout = resolve_plan(plan, profile)
    if plan.microbatch_size != profile.microbatch_size:
        profile = profile.rescaled(plan.microbatch_size)
    return boundary_bytes(profile, layout)


def _link_gbps(
    ops: list[dict[str, Any]],
    plan: Plan,
    cluster: Cluster | None,
    overhead_ms: float,
    waiting: set[tuple[int, int]],
    profile_bytes: dict[tuple[int, int], int],
) -> dict[int, float]:
    """Calibrated bandwidth per cluster level from the idle receivers' gaps (module
    docstring), less the overhead every op starts after (``op_overhead_ms``, which the
    calibrated ops carry); levels are those of ``cluster`` (one level without one). A
    receiver in ``waiting`` (its host had more ranks than cores) may have waited for a core
    rather than for the tensor: its gaps say nothing of the link. Each send counts the
    bytes the profile says it carries (``profile_bytes``, its share of its boundary's
    measured bytes): the simulator moves those, so a run of a smaller model than the
    profile's is reproduced, not priced at the profile's larger tensors."""
    compute = defaultdict(list)  # (stage, replica) -> its compute ops by start
    for op in ops:
        if op["op"] in _KINDS:
            compute[(op["stage"], op["replica"])].append(op)
    for mine in compute.values():
        mine.sort(key=lambda op: op["start_ms"])
    receiving = {
        (op["stage"], op["replica"], op["op"], op["microbatch"], op["step"]): op
        for op in ops
        if op["op"] in ("forward", "backward")
    }
    devices = plan.worker_devices()
    sent: dict[tuple[Any, ...], int] = defaultdict(int)  # a boundary's bytes per message
    for send in ops:
        if send["op"] in _TRANSFERS and isinstance(send.get("bytes"), int):
            sent[_boundary(send)] += send["bytes"]
    gaps: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for send in ops:
        kind = _TRANSFERS.get(send["op"])
        num_bytes = send.get("bytes")
        if kind is None or not isinstance(num_bytes, int) or num_bytes <= 0:
            continue
        peer = (send.get("peer_stage"), send.get("peer_replica", 0))
        receiver = receiving.get((*peer, kind, send.get("microbatch"), send["step"]))
        if (
            receiver is None
            or not _placed(devices, send["stage"], send["replica"])
            or not _placed(devices, *peer)
            or peer in waiting
        ):
            continue
        before = [op for op in compute[peer] if op["start_ms"] < receiver["start_ms"]]
        if before and before[-1]["end_ms"] > send["start_ms"]:
            continue  # the receiver was busy when the send started: the gap says nothing
        gap = receiver["start_ms"] - overhead_ms - send["start_ms"]
        if gap <= 0:
            continue  # there before the receiver could take it: nothing to learn
        peer_stage, peer_replica = int(peer[0]), int(peer[1])  # type: ignore[arg-type]
        level = (
            0
            if cluster is None
            else cluster.level_between(
                devices[send["stage"]][send["replica"]], devices[peer_stage][peer_replica]
            )
        )
        if level < 0:
            continue  # one device: the simulator moves nothing
        pair = (min(send["stage"], peer_stage), max(send["stage"], peer_stage))
        moved = profile_bytes.get(pair, num_bytes) * num_bytes / sent[_boundary(send)]
        if moved > 0:  # else the simulator moves nothing there: nothing to learn
            gaps[level].append((gap, moved))
    result = {}
    for level, samples in gaps.items():
        rates = sorted(num_bytes / gap for gap, num_bytes in samples)  # bytes per ms
        result[level] = statistics.median(rates) / gbps_to_bytes_per_ms(1.0)
    return result


def _boundary(send: Mapping[str, Any]) -> tuple[Any, ...]:
    """The message a send is part of: its two stages, direction, micro-batch and step."""
    return (send["stage"], send.get("peer_stage"), send["op"], send.get("microbatch"), send["step"])


def _placed(devices: list[list[int]], stage: Any, replica: Any) -> bool:
    return (
        isinstance(stage, int)
        and isinstance(replica, int)
        and 0 <= stage < len(devices)
        and 0 <= replica < len(devices[stage])
    )


def _with_links(cluster: Cluster | None, plan: Plan, link_gbps: dict[int, float]) -> Cluster | None:
    if not link_gbps:
        return cluster
    if cluster is None:
        num_devices = 1 + max(d for stage in plan.worker_devices() for d in stage)
        cluster = cluster_template([num_devices], [None], name="calibrated")
    levels = [
        level.model_copy(update={"bandwidth_gbps": link_gbps[idx]})
        if idx in link_gbps and math.isfinite(link_gbps[idx])
        else level
        for idx, level in enumerate(cluster.levels)
    ]
    return cluster.model_copy(update={"levels": levels})


def report(
    calibration: Calibration,
    profile: Profile,
    plan: Plan,
    cluster: Cluster | None,
    events: Iterable[Mapping[str, Any]],
    max_ops: int | None = None,
) -> dict[str, Any]:
    """The calibration's factors, and over the calibrated steps the step and each stage's
    compute per step (forwards, backwards with their recomputes, weight halves, update,
    and the overhead between ops the simulator adds to each of the first three; mean over
    replicas):
    measured, predicted from the profile and from the calibrated profile, and each
    prediction's error as measured / predicted - 1. Ranks that shared their hosts' cores
    are simulated so when predicted from the profile (``Calibration.placed``); the
    calibrated prediction gives each stage replica its device, since the run's op times
    already hold what sharing cost them. ``model_flops`` (per step), ``num_devices`` and
    ``peak_tflops`` (each device's, None when unknown) give the run's achieved TFLOP/s
    and model FLOP utilisation over its measured step."""
    steps = set(calibration.steps)
    ops = [op for op in op_events(events) if op["step"] in steps]
    placed = calibration.placed(plan, cluster)
    times = list(measured_step_times(ops).values())
    before = simulate(profile, *placed, with_timeline=False, max_ops=max_ops)
    after = simulate(
        calibration.profile, plan, calibration.cluster, with_timeline=False, max_ops=max_ops
    )
    busy: dict[tuple[int, int], dict[int, float]] = defaultdict(lambda: defaultdict(float))
    overhead = calibration.stages[0].measured.get("overhead", 0.0) if calibration.stages else 0.0
    for op in ops:  # a run's backwards hold their recomputes
        if op["op"] in ("forward", "backward", "weight", "update"):
            extra = overhead if op["op"] in ENGINE_OPS else 0.0  # as the simulator adds it
            busy[(op["stage"], op["replica"])][op["step"]] += op["end_ms"] - op["start_ms"] + extra
    stages = []
    for idx in range(plan.num_stages):
        per_step = [
            statistics.fmean(by_step.values())
            for (stage, _), by_step in busy.items()
            if stage == idx and by_step
        ]
        measured = statistics.fmean(per_step) if per_step else None
        stages.append(
            _compared(measured, before.stages[idx].busy_ms, after.stages[idx].busy_ms, stage=idx)
        )
    return {
        **calibration.summary(),
        "shared_cores": placed[0] is not plan,
        "step_ms": _compared(
            statistics.fmean(times) if times else None, before.step_time_ms, after.step_time_ms
        ),
        "stage_busy_ms": stages,
        "model_flops": before.model_flops,
        "num_devices": plan.num_workers,
        "peak_tflops": profile_peak(profile),
    }


def _compared(
    measured: float | None, predicted: float, calibrated: float, **extra: Any
) -> dict[str, Any]:
    def error(value: float) -> float | None:
        return None if not measured or not value else measured / value - 1

    return {
        **extra,
        "measured": measured,
        "predicted": predicted,
        "calibrated": calibrated,
        "predicted_error": error(predicted),
        "calibrated_error": error(calibrated),
    }


def measured_step_times(ops: list[dict[str, Any]]) -> dict[int, float]:
    """Each measured step's time, cut as the simulator cuts steps: a step ends when its last
    op ends, and lasts from the previous step's end (the first step measured has none, so
    it is left out)."""
    ends: dict[int, float] = {}
    for op in ops:
        ends[op["step"]] = max(ends.get(op["step"], -math.inf), op["end_ms"])
    order = sorted(ends)
    return {
        step: ends[step] - ends[previous]
        for previous, step in itertools.pairwise(order)
        if step == previous + 1
    }


def read_events(lines: Iterable[str], source: str) -> list[dict[str, Any]]:
    """The events of a metrics JSONL file (one JSON object a line; blank lines skipped)."""
    events = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise CalibrationError(f"{source} line {number}: not JSON ({exc})") from None
        if not isinstance(event, dict):
            raise CalibrationError(f"{source} line {number}: not a JSON object")
        if event.get("type") == "op" and not _is_op(event):
            raise CalibrationError(
                f"{source} line {number}: an op event needs stage, replica, "
                "op, step, start_ms and end_ms"
            )
        events.append(event)
    return events


def run_plan(events: Sequence[Mapping[str, Any]], source: str) -> tuple[Plan, int | None]:
    """The plan a run started with (the last ``plan`` event: ``pipestudio train`` writes
    one at the head of its metrics, again when it resumes), and the first step at which
    the run then migrated layers (None if it did not): from there on it ran another plan."""
    where = [idx for idx, event in enumerate(events) if event.get("type") == "plan"]
    if not where:
        raise CalibrationError(
            f"{source} names no plan (metrics written before plans were "
            "recorded in them): give the plan the run ran, --plan PLAN"
        )
    try:
        plan = Plan.model_validate(events[where[-1]].get("plan"))
    except ValueError as exc:
        raise CalibrationError(
            f"{source}: the run's plan is not a valid plan: {str(exc).splitlines()[0]}"
        ) from None
    migrated = [
        event["step"]
        for event in events[where[-1] :]
        if event.get("type") == "migration"
        and event.get("phase") == "done"
        and isinstance(event.get("step"), int)
        and not isinstance(event["step"], bool)
    ]
    return plan, min(migrated, default=None)


def _attempt(event: Mapping[str, Any]) -> int:
    value = event.get("attempt", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _is_op(event: Mapping[str, Any]) -> bool:
    ints = ("stage", "replica", "step")
    return (
        all(
            isinstance(event.get(k), int) and not isinstance(event.get(k), bool) and event[k] >= 0
            for k in ints
        )
        and event.get("op") in _OP_KINDS
        and all(
            isinstance(event.get(k), int | float)
            and not isinstance(event.get(k), bool)
            and math.isfinite(event[k])
            for k in ("start_ms", "end_ms")
        )
        and event["end_ms"] >= event["start_ms"]
    )


def _describe(steps: range) -> str:
    last = steps.stop - 1
    return f"{steps.start}.." + ("end" if last >= 1 << 61 else str(last))
