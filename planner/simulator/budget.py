"""The work budget of a simulation: how many ops it would build, counted before it starts.

The simulator's time and memory grow with the ops of its graph (``simulate.py``). Per
micro-batch and stage it builds a forward and a backward, a recompute when the stage
recomputes, a swap-out and a swap-in when it swaps, and under ``pipedream`` an update after
each backward; per micro-batch and pair of stages that exchange tensors, an activation and a
gradient transfer. Per step it adds an update per worker and an all-reduce per replicated
stage under the synchronous schedules, and under ``pipedream`` an all-reduce per round of r
micro-batches. ``pipedream`` also simulates warm-up and drain steps around the measured
ones (``padding_steps``). Counting all this takes time in the number of stages only, so a
request for a million micro-batches is refused in microseconds. Besides the ops, the memory
check of a device that several workers share scans every worker
(``MemoryLedger.device_fits``); ``_SCANS_PER_OP`` such scans count as one op.

The count is exact when every layer is kept, and an upper bound otherwise (a swap right
before its own backward, or a recompute or swap of nothing, builds no op).
"""

import math
from collections import Counter
from dataclasses import dataclass, replace

from pipestudio.planner.errors import WorkBudgetError
from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.plan import Plan, StageLayout
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.simulator.costs import boundary_bytes

#: Most ops a simulation may build when its caller asks for the default budget. At this
#: limit a simulation with the timeline takes 0.9 to 1.3 s and about 300 MB (without it
#: 0.6 to 0.7 s and 100 MB) on a 2-core machine: about 8 us and 2 KB per op
#: (docs/simulator.md gives the measurements).
DEFAULT_MAX_SIMULATED_OPS = 150_000

#: Worker scans of a shared device's memory check that take as long as one op (measured:
#: about 25 ns against 5 to 8 us).
_SCANS_PER_OP = 200

#: What to make smaller, by the field most responsible.
_ADVICE = {
    "stages.devices": "devices shared by several workers",
    "num_microbatches": "micro-batches or steps",
    "num_steps": "steps or micro-batches",
    "stages": "stages or micro-batches",
    "num_stages": "stages or micro-batches",
    "cluster.devices": "devices or micro-batches",
}


@dataclass(frozen=True)
class StageWork:
    """The ops one stage adds besides a forward and a backward per micro-batch."""

    replicas: int
    recomputes: bool
    swaps: bool
    updates: bool  # whether it has update ops: replicas to all-reduce or an update time


def padding_steps(schedule: str, num_workers: int, num_microbatches: int) -> tuple[int, int]:
    """Warm-up and drain steps simulated around the measured ones.

    ``pipedream`` never flushes: it needs enough micro-batches before the measured steps
    to fill the pipeline, and after them to keep it full while they finish. Under
    ``zero-bubble`` and ``interleaved-1f1b`` a step's start may overlap the previous step's
    tail (a later stage's deferred weight halves, a device's last chunks) when the stages
    differ: one step before the measured ones makes them the steady state a run measures.
    """
    if schedule in ("zero-bubble", "interleaved-1f1b"):
        return 1, 0
    if schedule != "pipedream":
        return 0, 0
    drain_steps = math.ceil(num_workers / num_microbatches)
    return drain_steps + 1, drain_steps


@dataclass(frozen=True)
class Workload:
    """The shape of a simulation: enough to count its ops (module docstring)."""

    schedule: str
    num_steps: int
    num_microbatches: int
    stages: tuple[StageWork, ...]
    num_boundaries: int  # pairs of stages (a, c) that exchange tensors
    num_shared_devices: int = 0  # devices that two or more workers share, with a memory

    @property
    def num_workers(self) -> int:
        return sum(stage.replicas for stage in self.stages)

    @property
    def num_padding_steps(self) -> int:
        return sum(padding_steps(self.schedule, self.num_workers, self.num_microbatches))

    def num_ops(self) -> int:
        per_microbatch = 2 * self.num_boundaries
        per_step = 0
        for stage in self.stages:
            per_microbatch += 2 + stage.recomputes + 2 * stage.swaps
            replicated = stage.replicas > 1
            if self.schedule == "pipedream":
                per_microbatch += stage.updates
                per_step += self.num_microbatches // stage.replicas if replicated else 0
            else:
                per_step += stage.replicas * stage.updates + replicated
        total_steps = self.num_steps + self.num_padding_steps
        return (
            total_steps * (self.num_microbatches * per_microbatch + per_step)
            + self.num_workers * self.num_shared_devices // _SCANS_PER_OP
        )


def plan_workload(profile: Profile, plan: Plan, layout: StageLayout, num_steps: int) -> Workload:
    """The workload of simulating ``num_steps`` steps of ``plan`` (resolved to ``layout``)."""
    stages = []
    for stage, indices in zip(plan.stages, layout.stage_layers, strict=True):
        policies = {plan.policy(profile.layers[idx].name) for idx in indices}
        updates = stage.replicas > 1 or any(profile.layers[idx].update_ms for idx in indices)
        stages.append(
            StageWork(stage.replicas, "recompute" in policies, "swap" in policies, updates)
        )
    return Workload(
        plan.schedule,
        num_steps,
        plan.num_microbatches,
        tuple(stages),
        len(boundary_bytes(profile, layout)),
    )


def most_boundaries(profile: Profile, num_stages: int) -> int:
    """The most pairs of stages that exchange tensors when ``profile`` is cut into
    ``num_stages`` runs of its layer order.

    Stage a sends to at most the later stages, and to at most as many as there are edges
    crossing the cut after it: ``w``, the most edges crossing any cut, 1 for a chain.
    """
    crossing = [0] * (profile.num_layers + 1)  # changes of the edges crossing each cut
    for src, succs in enumerate(profile.graph.succs):
        for dst in succs:
            crossing[src + 1] += 1
            crossing[dst + 1] -= 1
    width = most = 0
    for change in crossing:
        width += change
        most = max(most, width)
    return sum(min(num_stages - 1 - stage_idx, most) for stage_idx in range(num_stages - 1))


def shared_devices(worker_devices: list[list[int]], cluster: Cluster) -> int:
    """Devices with a memory that two or more workers share (their check scans them all)."""
    counts = Counter(device for devices in worker_devices for device in devices)
    return sum(
        1
        for device, count in counts.items()
        if count > 1
        and device < cluster.num_devices
        and cluster.devices[device].memory_bytes is not None
    )


def check_simulation(
    profile: Profile,
    plan: Plan,
    layout: StageLayout,
    cluster: Cluster | None,
    num_steps: int,
    max_ops: int | None,
) -> None:
    """Refuse to simulate ``plan`` when it would build more than ``max_ops`` ops: first by
    its ops, counted from its stages alone; then, its workers known to be few enough to
    list, with the memory checks of the devices they share."""
    if max_ops is None:
        return
    fields = {
        "num_microbatches": plan.num_microbatches,
        "num_steps": num_steps,
        "stages": plan.num_stages,
    }
    workload = plan_workload(profile, plan, layout, num_steps)
    check_budget(workload, max_ops, fields=fields)
    if cluster is not None:
        shared = shared_devices(plan.worker_devices(), cluster)
        check_budget(replace(workload, num_shared_devices=shared), max_ops, fields=fields)


def check_budget(workload: Workload, max_ops: int | None, *, fields: dict[str, int]) -> None:
    """Refuse ``workload`` when it builds more than ``max_ops`` ops (``None``: no limit).

    ``fields`` are the inputs the caller can change, by name; the error blames the
    largest, which is the one that multiplies the work most.
    """
    if max_ops is None:
        return
    num_ops = workload.num_ops()
    if num_ops <= max_ops:
        return
    field, value = max(fields.items(), key=lambda item: item[1])
    if 2 * workload.num_workers * workload.num_shared_devices // _SCANS_PER_OP > num_ops:
        field, value = "stages.devices", workload.num_shared_devices
    steps = f"{workload.num_steps} step{'s' if workload.num_steps != 1 else ''}"
    if workload.num_padding_steps:
        steps += f" (and {workload.num_padding_steps} warm-up and drain steps)"
    raise WorkBudgetError(
        f"{field}={value}: simulating {steps} of {workload.num_microbatches} micro-batches on "
        f"{workload.num_workers} workers is {num_ops} operations, more than the limit of "
        f"{max_ops}; use fewer {_ADVICE.get(field, 'micro-batches or steps')}",
        field=field,
        limit=max_ops,
        num_ops=num_ops,
    )
