"""Discrete-event simulation of a plan on a cluster: timeline, step time and memory.

Every worker (stage replica) runs its forwards, recomputes, backwards and updates in the
order of its schedule (``schedule.py``) on its device's compute stream. Beside it:

- activations and gradients travel between workers' devices over the link of the innermost
  level that holds both (``Cluster``), one transfer at a time per direction, overlapped
  with compute. Between two workers on one device they go through host memory, as the
  engine sends them (NCCL cannot connect a GPU to itself): out over the device's
  device-to-host link, from one process to the other at the device's ``staging_gbps``
  (gloo on the host), back over its host-to-device link, one such transfer at a time per
  device; a device whose host links are free (a CPU, or no cluster) passes them for
  nothing;
- a stage with swapped layers sends their saved tensors to the host right after each
  forward (unless that micro-batch's backward comes next: they would come straight back)
  and fetches them back as soon as the pass (forward, recompute or backward) before that
  micro-batch's backward starts (the schedule knows what comes next) and every swap-out
  issued before has ended, one transfer at a time per direction of the host link; the
  backward waits for the fetch, which is the stall the schedule cannot hide;
- recompute runs, when the output gradient has arrived, just before the backward;
- each forward, backward and weight-gradient op also takes the profile's
  ``op_overhead_ms``: what the engine spends between two compute ops (posting transfers,
  sampling data, Python), once per op however much work the op holds, so a schedule with
  more, shorter ops (interleaved chunks, split backwards) pays it more often; the engine
  runs a recompute inside its backward, so a recompute pays none of its own;
- replicas of a stage all-reduce their gradients (ring: 2 (r-1)/r of the parameter bytes
  over the slowest link between them) before updating: once per step for the synchronous
  schedules, once per round of r micro-batches for ``pipedream``.

Without a cluster every link is free and memory unlimited.

Synchronous schedules simulate ``num_steps`` steps and report their mean. ``pipedream``
never flushes, so it also simulates warm-up steps before and drain steps after the
measured ones, reports their mean, and keeps in the timeline only the ops that overlap
the measured steps. Its steady state can repeat over more than one step (a slow transfer
or swap delays every few micro-batches), so steps may differ; ``step_times_ms`` lists them
and more steps give a truer mean.
"""

import gc
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise

from pydantic import TypeAdapter

from pipestudio.planner.errors import PlanError
from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.plan import Plan, StageLayout, resolve_plan
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.formats.result import (
    COMPUTE_OPS,
    OpKind,
    SimResult,
    StageResult,
    TimelineOp,
)
from pipestudio.planner.simulator.budget import check_simulation, padding_steps
from pipestudio.planner.simulator.costs import StageCosts, boundary_bytes, stage_costs
from pipestudio.planner.simulator.events import NO_RESOURCE, OpGraph, Timing
from pipestudio.planner.simulator.memory import MemoryLedger
from pipestudio.planner.simulator.peaks import model_flop_utilisation, profile_peak
from pipestudio.planner.simulator.schedule import (
    BACKWARD,
    WEIGHT,
    interleaved_order,
    worker_order,
    zero_bubble_order,
)
from pipestudio.planner.units import transfer_ms

_TIMELINE = TypeAdapter(list[TimelineOp])
#: Ops that change a worker's memory (the others only move data between devices).
_MEMORY_OPS = frozenset({"forward", "backward", "weight", "recompute", "swap_out", "swap_in"})
#: The compute ops the engine runs one by one, each with ``Profile.op_overhead_ms``.
ENGINE_OPS = frozenset({"forward", "backward", "weight"})


@dataclass
class _Op:
    """What an op of the graph stands for; memory deltas apply at its start and end."""

    kind: OpKind
    worker: int
    microbatch: int | None
    step: int
    peer_worker: int | None = None
    num_bytes: int | None = None
    memory_at_start: tuple[int, int] = (0, 0)  # (activations, workspace) bytes added
    memory_at_end: tuple[int, int] = (0, 0)


@dataclass
class _Build:
    """The op graph of a plan under construction."""

    plan: Plan
    cluster: Cluster | None
    costs: list[StageCosts]
    boundaries: dict[tuple[int, int], int]
    devices: list[list[int]]
    op_overhead_ms: float = 0.0
    graph: OpGraph = field(default_factory=OpGraph)
    ops: list[_Op] = field(default_factory=list)
    workers: list[tuple[int, int]] = field(default_factory=list)
    worker_id: dict[tuple[int, int], int] = field(default_factory=dict)
    last_op: dict[int, int] = field(default_factory=dict)  # stream -> its last op
    last_pass: dict[int, int] = field(default_factory=dict)  # the same, updates left out
    forward: dict[tuple[int, int], int] = field(default_factory=dict)  # (stage, mb) -> op
    first_backward: dict[tuple[int, int], int] = field(default_factory=dict)  # R or B
    backward: dict[tuple[int, int], int] = field(default_factory=dict)
    swap_in: dict[tuple[int, int], int] = field(default_factory=dict)
    last_swap_out: dict[int, int] = field(default_factory=dict)  # stream -> op
    # stream -> the last swap-out issued before its last compute op started
    swap_out_gate: dict[int, int] = field(default_factory=dict)
    warmups: list[int] = field(default_factory=list)  # 1F1B warm-up forwards per stage
    compute_res: dict[int, int] = field(default_factory=dict)
    link_res: dict[tuple[str, int, int], int] = field(default_factory=dict)
    rounds: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=dict)
    streams: list[int] = field(default_factory=list)  # worker -> its compute stream

    def __post_init__(self) -> None:
        self.warmups = self.plan.all_warmup_forwards()
        for stage_idx, stage in enumerate(self.plan.stages):
            for replica in range(stage.replicas):
                self.worker_id[(stage_idx, replica)] = len(self.workers)
                self.workers.append((stage_idx, replica))
        # looked up for every compute op: worked out once
        self.streams = [
            self.plan.rank_of_stage(stage) if self.plan.interleaved else worker
            for worker, (stage, _) in enumerate(self.workers)
        ]

    def device(self, worker: int) -> int:
        stage_idx, replica = self.workers[worker]
        return self.devices[stage_idx][replica]

    def stream(self, worker: int) -> int:
        """The process whose order the worker's compute ops follow: the worker itself, or
        for an interleaved plan the device rank that runs all its chunks in one order."""
        return self.streams[worker]

    def worker_of(self, stage_idx: int, microbatch: int) -> int:
        return self.worker_id[(stage_idx, microbatch % self.plan.stages[stage_idx].replicas)]

    def resource(self, kind: str, device_a: int, device_b: int = -1) -> int:
        key = (kind, device_a, device_b)
        if key not in self.link_res:
            self.link_res[key] = self.graph.new_resource()
        return self.link_res[key]

    def add(self, op: _Op, duration_ms: float, resource: int = NO_RESOURCE) -> int:
        self.ops.append(op)
        return self.graph.add(duration_ms, resource)

    def add_compute(self, op: _Op, duration_ms: float) -> int:
        if op.kind in ENGINE_OPS:
            duration_ms += self.op_overhead_ms
        op_id = self.add(op, duration_ms, self.resource("compute", self.device(op.worker)))
        stream = self.stream(op.worker)
        previous = self.last_op.get(stream)
        if previous is not None:
            self.graph.after(op_id, previous)
        self.last_op[stream] = op_id
        if op.kind != "update":  # a fetch overlaps the last pass, not a short update
            self.last_pass[stream] = op_id
            swap_out = self.last_swap_out.get(stream)
            if swap_out is not None:
                self.swap_out_gate[stream] = swap_out
        return op_id


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The op graph allocates many small objects and no reference cycles; pausing the
    cyclic collector while it is built and run saves a fifth of the time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def simulate(
    profile: Profile,
    plan: Plan,
    cluster: Cluster | None = None,
    *,
    num_steps: int = 1,
    with_timeline: bool = True,
    max_ops: int | None = None,
) -> SimResult:
    """Predict what ``plan`` does on ``cluster`` (see the module docstring).

    ``max_ops`` bounds the ops the simulation may build (``budget.py``; ``None``: no
    bound): a larger one raises ``WorkBudgetError`` before any is built.
    """
    with _gc_paused():
        return _simulate(profile, plan, cluster, num_steps, with_timeline, max_ops)


def _simulate(
    profile: Profile,
    plan: Plan,
    cluster: Cluster | None,
    num_steps: int,
    with_timeline: bool,
    max_ops: int | None,
) -> SimResult:
    if num_steps < 1:
        raise PlanError(f"the number of steps to simulate must be >= 1, got {num_steps}")
    layout = resolve_plan(plan, profile)  # the rescaled profile has the same layers
    check_simulation(profile, plan, layout, cluster, num_steps, max_ops)
    if plan.microbatch_size != profile.microbatch_size:
        profile = profile.rescaled(plan.microbatch_size)
    devices = plan.worker_devices()
    if cluster is not None:
        for stage_devices in devices:
            for device_idx in stage_devices:
                cluster.check_device(device_idx)
    build = _Build(
        plan,
        cluster,
        stage_costs(profile, plan, layout),
        boundary_bytes(profile, layout),
        devices,
        profile.op_overhead_ms,
    )
    warmup_steps, drain_steps = padding_steps(
        plan.schedule, plan.num_workers, plan.num_microbatches
    )
    total_steps = warmup_steps + num_steps + drain_steps
    if plan.schedule == "pipedream":
        _build_stream(build, list(range(total_steps * plan.num_microbatches)))
    else:
        for step in range(total_steps):
            first = step * plan.num_microbatches
            _build_stream(build, list(range(first, first + plan.num_microbatches)))
    _add_allreduces(build)
    timing = build.graph.run()
    return _result(build, profile, layout, timing, warmup_steps, num_steps, with_timeline)


def _build_stream(build: _Build, microbatches: list[int]) -> None:
    """Ops of ``microbatches`` on every worker: one step, or pipedream's whole stream."""
    plan = build.plan
    sync = plan.schedule != "pipedream"
    for order in _orders(build, microbatches):
        for pos, (kind, worker, mb) in enumerate(order):
            if kind == BACKWARD:
                _add_backward(build, worker, mb)
                if not sync:
                    stage_replicas = plan.stages[build.workers[worker][0]].replicas
                    _add_update(build, worker, mb // stage_replicas, mb)
            elif kind == WEIGHT:
                _add_weight(build, worker, mb)
            else:
                swap = order[pos + 1 : pos + 2] != [(BACKWARD, worker, mb)]
                _add_forward(build, worker, mb, swap=swap)
    if sync:
        for worker in range(len(build.workers)):
            _add_update(build, worker, microbatches[0] // plan.num_microbatches, None)
    _add_transfers(build, microbatches)


def _orders(build: _Build, microbatches: list[int]) -> list[list[tuple[str, int, int]]]:
    """Each process's compute ops over ``microbatches`` as (kind, worker, micro-batch), in
    the order it runs them (``schedule.py``)."""
    plan = build.plan
    if plan.interleaved:
        devices, chunks = plan.num_workers, plan.virtual_stages
        return [
            [
                (kind, build.worker_id[(chunk * devices + device, 0)], mb)
                for kind, chunk, mb in interleaved_order(device, devices, chunks, microbatches)
            ]
            for device in range(devices)
        ]
    orders = []
    for worker, (stage_idx, replica) in enumerate(build.workers):
        replicas = plan.stages[stage_idx].replicas
        # Micro-batch i goes to replica i mod r; ``microbatches`` is a run of consecutive ones.
        mine = microbatches[(replica - microbatches[0]) % replicas :: replicas]
        if plan.schedule == "zero-bubble":
            order = zero_bubble_order(mine, build.warmups[stage_idx], stage_idx)
        else:
            order = worker_order(plan.schedule, mine, build.warmups[stage_idx])
        orders.append([(kind, worker, mb) for kind, mb in order])
    return orders


def _add_forward(build: _Build, worker: int, mb: int, swap: bool) -> None:
    stage_idx = build.workers[worker][0]
    costs = build.costs[stage_idx]
    step = mb // build.plan.num_microbatches
    activations = costs.kept_bytes + costs.swap_bytes
    op = _Op(
        "forward",
        worker,
        mb,
        step,
        memory_at_start=(0, costs.workspace_bytes),
        memory_at_end=(activations, -costs.workspace_bytes),
    )
    build.forward[(stage_idx, mb)] = build.add_compute(op, costs.fwd_ms)
    if costs.swap_bytes and swap:
        device = build.device(worker)
        out_ms = transfer_ms(costs.swap_bytes, _host_gbps(build, device, "device_to_host_gbps"))
        swap_out = build.add(
            _Op(
                "swap_out",
                worker,
                mb,
                step,
                num_bytes=costs.swap_bytes,
                memory_at_end=(-costs.swap_bytes, 0),
            ),
            out_ms,
            build.resource("d2h", device),
        )
        build.graph.after(swap_out, build.forward[(stage_idx, mb)])
        in_ms = transfer_ms(costs.swap_bytes, _host_gbps(build, device, "host_to_device_gbps"))
        swap_in = build.add(
            _Op(
                "swap_in",
                worker,
                mb,
                step,
                num_bytes=costs.swap_bytes,
                memory_at_start=(costs.swap_bytes, 0),
            ),
            in_ms,
            build.resource("h2d", device),
        )
        build.graph.after(swap_in, swap_out)
        build.swap_in[(stage_idx, mb)] = swap_in
        build.last_swap_out[worker] = swap_out


def _add_backward(build: _Build, worker: int, mb: int) -> None:
    stage_idx = build.workers[worker][0]
    costs = build.costs[stage_idx]
    step = mb // build.plan.num_microbatches
    swap_in = build.swap_in.get((stage_idx, mb))
    if swap_in is not None:
        # Fetch the swapped tensors while the op before this backward runs, once every
        # swap-out issued before has ended (so at most two swapped micro-batches are here).
        build.graph.after_start(swap_in, build.last_pass[build.stream(worker)])
        gate = build.swap_out_gate.get(build.stream(worker))
        if gate is not None:
            build.graph.after(swap_in, gate)
    workspace = costs.workspace_bytes
    if costs.recompute_ms or costs.recompute_bytes:
        recompute = build.add_compute(
            _Op(
                "recompute",
                worker,
                mb,
                step,
                memory_at_start=(0, workspace),
                memory_at_end=(costs.recompute_bytes, -workspace),
            ),
            costs.recompute_ms,
        )
        build.first_backward[(stage_idx, mb)] = recompute
    freed = costs.kept_bytes + costs.swap_bytes + costs.recompute_bytes
    duration = costs.bwd_ms
    if build.plan.schedule == "zero-bubble":  # the weight half runs later (``_add_weight``)
        freed -= costs.weight_bytes
        duration = costs.input_ms
    backward = build.add_compute(
        _Op(
            "backward",
            worker,
            mb,
            step,
            memory_at_start=(0, workspace),
            memory_at_end=(-freed, -workspace),
        ),
        duration,
    )
    build.first_backward.setdefault((stage_idx, mb), backward)
    build.backward[(stage_idx, mb)] = backward
    if swap_in is not None:
        build.graph.after(backward, swap_in)


def _add_weight(build: _Build, worker: int, mb: int) -> None:
    """Zero-bubble's weight-gradient half of a backward: it frees what only it needed
    (``StageCosts.weight_bytes``)."""
    costs = build.costs[build.workers[worker][0]]
    build.add_compute(
        _Op(
            "weight",
            worker,
            mb,
            mb // build.plan.num_microbatches,
            memory_at_start=(0, costs.workspace_bytes),
            memory_at_end=(-costs.weight_bytes, -costs.workspace_bytes),
        ),
        costs.weight_ms,
    )


def _add_update(build: _Build, worker: int, round_idx: int, mb: int | None) -> None:
    """The optimizer update after a worker's backward (pipedream) or step (sync).

    Replicas first all-reduce their gradients: ``_add_allreduces`` later joins the updates
    of one round (the same step, or pipedream's r consecutive micro-batches).
    """
    stage_idx = build.workers[worker][0]
    costs = build.costs[stage_idx]
    replicas = build.plan.stages[stage_idx].replicas
    if replicas == 1 and costs.update_ms == 0:
        return
    step = round_idx if mb is None else mb // build.plan.num_microbatches
    backward = build.last_op[build.stream(worker)]
    update = build.add_compute(_Op("update", worker, mb, step), costs.update_ms)
    if replicas > 1:
        build.rounds.setdefault((stage_idx, round_idx), []).append((backward, update))


def _add_allreduces(build: _Build) -> None:
    """Ring all-reduce: each replica sends and receives 2 (r-1)/r of the gradients."""
    for (stage_idx, _), members in build.rounds.items():
        updates = [update for _, update in members]
        workers = [build.ops[update].worker for update in updates]
        devices = [build.device(worker) for worker in workers]
        num_bytes = build.costs[stage_idx].param_bytes
        slowest = None if build.cluster is None else build.cluster.slowest_bandwidth_gbps(devices)
        count = len(devices)
        duration = transfer_ms(2 * (count - 1) / count * num_bytes, slowest)
        first = build.ops[updates[0]]
        allreduce = build.add(
            _Op("allreduce", first.worker, first.microbatch, first.step, num_bytes=num_bytes),
            duration,
            build.resource("allreduce", stage_idx),
        )
        for backward, update in members:
            build.graph.after(allreduce, backward)
            build.graph.after(update, allreduce)


def _add_transfers(build: _Build, microbatches: list[int]) -> None:
    """Activations forward and gradients backward between stages, per micro-batch."""
    links: dict[tuple[int, int, int], tuple[float, int]] = {}
    for (src_stage, dst_stage), num_bytes in build.boundaries.items():
        for mb in microbatches:
            src, dst = build.worker_of(src_stage, mb), build.worker_of(dst_stage, mb)
            step = mb // build.plan.num_microbatches
            transfers: tuple[tuple[OpKind, int, int, int, int], ...] = (
                (
                    "send_activation",
                    src,
                    dst,
                    build.forward[(src_stage, mb)],
                    build.forward[(dst_stage, mb)],
                ),
                (
                    "send_gradient",
                    dst,
                    src,
                    build.backward[(dst_stage, mb)],
                    build.first_backward[(src_stage, mb)],
                ),
            )
            for kind, sender, receiver, after_op, before_op in transfers:
                link = links.get((sender, receiver, num_bytes))
                if link is None:
                    link = links[(sender, receiver, num_bytes)] = _link(
                        build, sender, receiver, num_bytes
                    )
                send = build.add(
                    _Op(kind, sender, mb, step, peer_worker=receiver, num_bytes=num_bytes), *link
                )
                build.graph.after(send, after_op)
                build.graph.after(before_op, send)


def _link(build: _Build, sender: int, receiver: int, num_bytes: int) -> tuple[float, int]:
    """Duration and resource of a transfer between two workers' devices."""
    device_a, device_b = build.device(sender), build.device(receiver)
    if device_a == device_b:  # staged through host memory (module docstring)
        staged_ms = sum(
            transfer_ms(num_bytes, _host_gbps(build, device_a, attribute))
            for attribute in ("device_to_host_gbps", "staging_gbps", "host_to_device_gbps")
        )
        return staged_ms, build.resource("staged", device_a) if staged_ms else NO_RESOURCE
    bandwidth = None if build.cluster is None else build.cluster.bandwidth_gbps(device_a, device_b)
    return transfer_ms(num_bytes, bandwidth), build.resource("link", device_a, device_b)


def _host_gbps(build: _Build, device_idx: int, attribute: str) -> float | None:
    if build.cluster is None:
        return None
    value: float | None = getattr(build.cluster.devices[device_idx], attribute)
    return value


def stage_flops(profile: Profile, plan: Plan, stage_idx: int, layers: Sequence[int]) -> int:
    """FLOPs per step of one replica of stage ``stage_idx`` (holding ``layers``): the
    forward and backward of each of its micro-batches, and the forward again of recomputed
    layers."""
    per_microbatch = 0
    for idx in layers:
        layer = profile.layers[idx]
        again = plan.policies.get(layer.name) == "recompute"
        per_microbatch += layer.fwd_flops * (2 if again else 1) + layer.bwd_flops
    return per_microbatch * plan.num_microbatches // plan.stages[stage_idx].replicas


def _result(
    build: _Build,
    profile: Profile,
    layout: StageLayout,
    timing: Timing,
    warmup_steps: int,
    num_steps: int,
    with_timeline: bool,
) -> SimResult:
    plan, ops = build.plan, build.ops
    start, end = timing.start_ms, timing.end_ms
    step_end = [0.0] * (warmup_steps + num_steps)
    for op_id, op in enumerate(ops):
        if op.step < len(step_end):
            step_end[op.step] = max(step_end[op.step], end[op_id])
    bounds = [0.0, *step_end] if not warmup_steps else step_end[warmup_steps - 1 :]
    step_times = [later - earlier for earlier, later in pairwise(bounds)]
    window = (bounds[0], bounds[-1])
    step_time = (window[1] - window[0]) / num_steps
    ledger = MemoryLedger(build.workers, build.costs, plan)
    # a synchronous step whose start overlaps the previous one's tail (a step simulated
    # before it: ``budget.padding_steps``) counts its own ops; pipedream, the window's
    by_step = bool(warmup_steps) and plan.schedule != "pipedream"
    busy = [0.0] * len(build.workers)
    recompute = [0.0] * len(build.workers)
    for op_id, op in enumerate(ops):
        if op.kind in _MEMORY_OPS:
            ledger.record(
                op.worker,
                timing.start_seq[op_id],
                start[op_id],
                op.memory_at_start,
                op.kind,
                at_end=False,
            )
            ledger.record(
                op.worker, timing.end_seq[op_id], end[op_id], op.memory_at_end, op.kind, at_end=True
            )
        if op.kind in COMPUTE_OPS:
            if by_step:  # each measured step's own ops, wherever they ran
                measured = warmup_steps <= op.step < warmup_steps + num_steps
                overlap = end[op_id] - start[op_id] if measured else 0.0
            else:
                overlap = min(end[op_id], window[1]) - max(start[op_id], window[0])
            if overlap > 0:
                busy[op.worker] += overlap
                if op.kind == "recompute":
                    recompute[op.worker] += overlap
    peaks = ledger.peaks()
    fits = _fits_by_device(build, ledger)
    stages = []
    for stage_idx, stage in enumerate(plan.stages):
        flops = stage_flops(profile, plan, stage_idx, layout.stage_layers[stage_idx])
        workers = [build.worker_id[(stage_idx, r)] for r in range(stage.replicas)]
        top = max(workers, key=lambda w: peaks[w].memory.total_bytes)
        memory_limits = [_device_memory(build.cluster, build.device(w)) for w in workers]
        limit = None if None in memory_limits else min(m for m in memory_limits if m)
        stage_peak = peaks[top].memory.total_bytes
        stages.append(
            StageResult(
                index=stage_idx,
                layers=[profile.layers[i].name for i in layout.stage_layers[stage_idx]],
                replicas=stage.replicas,
                devices=build.devices[stage_idx],
                busy_ms=sum(busy[w] for w in workers) / len(workers) / num_steps,
                recompute_ms=sum(recompute[w] for w in workers) / len(workers) / num_steps,
                swap_bytes=build.costs[stage_idx].swap_bytes
                * plan.num_microbatches
                // stage.replicas,
                peak_bytes=stage_peak,
                memory=peaks[top].memory,
                device_memory_bytes=limit,
                fits=all(fits[build.device(w)] for w in workers),
                max_inflight_microbatches=max(peaks[w].max_inflight for w in workers),
                num_weight_versions=max(peaks[w].weight_versions for w in workers),
                flops=flops,
                tflops=flops / step_time / 1e9 if step_time > 0 else 0.0,
            )
        )
    stage_busy = sum(stage.busy_ms for stage in stages)
    # an interleaved device holds several stages (chunks): the bubble is the devices' idle
    devices = plan.num_workers if plan.interleaved else len(stages)
    bubble = 1.0 - stage_busy / (devices * step_time) if step_time > 0 else 0.0
    samples = plan.num_microbatches * plan.microbatch_size
    model_flops = plan.num_microbatches * sum(
        layer.fwd_flops + layer.bwd_flops for layer in profile.layers
    )
    model_tflops = model_flops / step_time / 1e9 if step_time > 0 else 0.0
    return SimResult(
        model=plan.model,
        schedule=plan.schedule,
        num_stages=plan.num_stages,
        num_microbatches=plan.num_microbatches,
        microbatch_size=plan.microbatch_size,
        num_steps=num_steps,
        step_time_ms=step_time,
        samples_per_s=samples / step_time * 1e3 if step_time > 0 else 0.0,
        bubble_fraction=max(0.0, bubble),
        fits=all(stage.fits for stage in stages),
        device_peak_bytes=_device_peaks(build, ledger),
        model_flops=model_flops,
        model_tflops=model_tflops,
        mfu=model_flop_utilisation(model_tflops, plan.num_workers, profile_peak(profile))
        if model_flops
        else None,
        step_times_ms=step_times,
        window_start_ms=window[0],
        window_end_ms=window[1],
        stages=stages,
        timeline=_timeline(
            build,
            start,
            end,
            window,
            range(warmup_steps, warmup_steps + num_steps) if by_step else None,
        )
        if with_timeline
        else [],
        memory_timeline=ledger.tracks(build.workers, window) if with_timeline else [],
    )


def _fits_by_device(build: _Build, ledger: MemoryLedger) -> dict[int, bool]:
    """Whether the workers on each device fit its memory together. ``device_fits`` scans
    every worker, so it runs once per device that two or more workers share, and a
    device's only worker is compared with the memory directly."""
    workers = range(len(build.workers))
    sharing = Counter(build.device(worker) for worker in workers)
    peaks = ledger.peaks()
    fits: dict[int, bool] = {}
    for worker in workers:
        device = build.device(worker)
        limit = _device_memory(build.cluster, device)
        if limit is None:
            fits[device] = True
        elif sharing[device] == 1:
            fits[device] = peaks[worker].memory.total_bytes <= limit
        elif device not in fits:
            fits[device] = ledger.device_fits(device, limit, build.devices)
    return fits


def _device_peaks(build: _Build, ledger: MemoryLedger) -> list[int]:
    """Each device's peak, its workers together (index: device; 0 where none runs)."""
    used = sorted({build.device(worker) for worker in range(len(build.workers))})
    peaks = [0] * (used[-1] + 1 if used else 0)
    for device in used:
        peaks[device] = ledger.device_peak(device, build.devices)
    return peaks


def _device_memory(cluster: Cluster | None, device_idx: int) -> int | None:
    return None if cluster is None else cluster.devices[device_idx].memory_bytes


def _timeline(
    build: _Build,
    start: list[float],
    end: list[float],
    window: tuple[float, float],
    steps: range | None = None,
) -> list[TimelineOp]:
    """Ops that overlap the measured window (and, with ``steps``, every op of those
    steps, some of which ran before it), in start order."""
    rows = []
    for op_id, op in enumerate(build.ops):
        mine = steps is not None and op.step in steps
        if not mine and (end[op_id] < window[0] or start[op_id] > window[1]):
            continue
        stage_idx, replica = build.workers[op.worker]
        peer = build.workers[op.peer_worker] if op.peer_worker is not None else (None, None)
        rows.append(
            {
                "stage": stage_idx,
                "replica": replica,
                "op": op.kind,
                "microbatch": op.microbatch,
                "step": op.step,
                "start_ms": start[op_id],
                "end_ms": end[op_id],
                "peer_stage": peer[0],
                "peer_replica": peer[1],
                "bytes": op.num_bytes,
            }
        )
    rows.sort(key=lambda row: (row["start_ms"], row["stage"], row["replica"]))
    return _TIMELINE.validate_python(rows)
