"""The planners' cost model of a stage: its time per micro-batch and its peak memory.

Planners compare partitions with this model; the simulator then predicts the chosen plan
in full. The model is the simulator's steady state in closed form (tests hold the two to
each other):

Memory of a replica of stage s, which holds k micro-batches in flight (gpipe: its m/r
micro-batches; 1f1b: min(w_s + 1, m/r); pipedream: w_s + 1, with w_s its warm-up forwards)::

    static      = params x (2 + optimizer factor) + params x (k - 1) for pipedream's versions
    activations = k x (kept + checkpoints) + recomputed + workspace + c x swapped

where c = 2 when k >= 2 (the micro-batch being computed and the one fetched ahead of its
backward) and 1 otherwise. This equals the simulator's peak whenever each swap-out takes no
longer than the stage's shorter pass, min(F, B), which the memory optimizers respect
(tests/planner/cost_model/test_stage_model.py checks both on random stages).

A replica's compute per micro-batch, with F, B, R the forward, backward and recompute time
and x, y the swap-out and swap-in time of a micro-batch's swapped bytes, is::

    C = max(F + B + R + stall, x, y)

The fetch for a backward starts with the op before it, so it hides under that op and the
recompute: the stall is max(0, y - F - R) for 1F1B stages with a warm-up (the op before is
a forward) and max(0, y - B - R) for GPipe (the op before is a backward). A stage with one
micro-batch in flight (the last stage under 1F1B and pipedream) runs each forward's
backward right after it, so its swapped tensors stay on the device (x = y = 0), as in the
engine; GPipe likewise keeps its last micro-batch's, an end effect the model leaves out.

A stage of r replicas (``stage_context``: its first worker w0 and r; workers run on
devices of the same numbers unless a plan places them) shares the pipeline's m
micro-batches, m / r per replica, and its 1F1B warm-up is (W - w0 - 1) // r forwards for W
workers in all, as the Plan format defines it. Its time per micro-batch of the pipeline,
with A the ring all-reduce of its gradients (2 (r - 1) / r x params over the slowest link
between its devices; 0 for one replica)::

    pipedream:  T_s = (C + update + A) / r        each replica updates after each backward
    otherwise:  T_s = C / r + (update + A) / m    one update and all-reduce per step

A link between stages is a stage of its own, taking bytes / bandwidth per micro-batch in
each direction, over the link between the sending stage's last device and the receiving
stage's first (``request.plan_cost``, the ``optimal`` planner). It is not divided among
replicas, although r replica pairs may send at once; but a pair whose devices sit farther
apart than those two may use a slower level, which the model does not see.

For pipedream the model is the simulator's steady state (a step takes m x the slowest
T_s) for straight pipelines with free links, but for a few that repeat over two steps;
with slow links or replicas the simulated step is often slower, never faster in the tests
(tests/planner/cost_model/test_stage_model.py, test_optimal.py).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.plan import OPTIMIZER_STATE_FACTOR
from pipestudio.planner.simulator.costs import StageCosts
from pipestudio.planner.units import gbps_to_bytes_per_ms, transfer_ms


@dataclass(frozen=True)
class StageContext:
    """What a stage's cost depends on besides its layers: position, schedule, device."""

    schedule: str
    inflight: int
    warmup: int
    replicas: int
    num_microbatches: int
    optimizer_factor: int
    memory_bytes: int | None
    host_in_bytes_per_ms: float | None
    host_out_bytes_per_ms: float | None
    allreduce_ms_per_param_byte: float = 0.0

    @property
    def weight_versions(self) -> int:
        return self.inflight if self.schedule == "pipedream" else 1

    @property
    def swap_buffers(self) -> int:
        return 2 if self.inflight >= 2 else 1

    @property
    def swaps_out(self) -> bool:
        """Whether swapped tensors leave the device: not with one micro-batch in flight."""
        return self.inflight >= 2


def stage_context(
    schedule: str,
    num_microbatches: int,
    optimizer: str,
    cluster: Cluster | None = None,
    *,
    first_worker: int,
    replicas: int,
    num_workers: int,
    devices: Sequence[int] | None = None,
) -> StageContext:
    """The context of a stage whose ``replicas`` replicas are workers first_worker, ...,
    first_worker + replicas - 1 of a pipeline of ``num_workers`` workers, in pipeline order.

    Its warm-up counts the workers from its first to the end, as the Plan format's 1F1B does:
    (num_workers - first_worker - 1) // replicas forwards; each replica runs m / r of the m
    micro-batches. Worker w runs on device w unless ``devices`` names the replicas' devices
    (the ``optimal`` planner places stages on consecutive devices, so a stage is its first
    device and its replica count).
    """
    if devices is None:
        devices = range(first_worker, first_worker + replicas)
    warmup = (num_workers - first_worker - 1) // replicas
    per_replica = num_microbatches // replicas
    inflight = {"gpipe": per_replica, "1f1b": min(warmup + 1, per_replica)}.get(
        schedule, warmup + 1
    )
    memory = host_in = host_out = None
    allreduce = 0.0
    if cluster is not None:
        used = [cluster.devices[d] for d in devices]
        limits = [d.memory_bytes for d in used if d.memory_bytes is not None]
        memory = min(limits) if limits else None
        host_in = _slowest(d.host_to_device_gbps for d in used)
        host_out = _slowest(d.device_to_host_gbps for d in used)
        allreduce = _allreduce_ms_per_byte(cluster, list(devices))
    return StageContext(
        schedule=schedule,
        inflight=inflight,
        warmup=warmup,
        replicas=replicas,
        num_microbatches=num_microbatches,
        optimizer_factor=OPTIMIZER_STATE_FACTOR[optimizer],
        memory_bytes=memory,
        host_in_bytes_per_ms=host_in,
        host_out_bytes_per_ms=host_out,
        allreduce_ms_per_param_byte=allreduce,
    )


def stage_contexts(
    schedule: str,
    replicas: list[int],
    num_microbatches: int,
    optimizer: str,
    cluster: Cluster | None = None,
    devices: list[list[int]] | None = None,
) -> list[StageContext]:
    """Contexts of a pipeline's stages, in order (devices default to consecutive ones)."""
    contexts, first = [], 0
    for stage_idx, count in enumerate(replicas):
        contexts.append(
            stage_context(
                schedule,
                num_microbatches,
                optimizer,
                cluster,
                first_worker=first,
                replicas=count,
                num_workers=sum(replicas),
                devices=None if devices is None else devices[stage_idx],
            )
        )
        first += count
    return contexts


def _slowest(values: object) -> float | None:
    rates = [gbps_to_bytes_per_ms(v) for v in values if v is not None]  # type: ignore[attr-defined]
    return min(rates) if rates else None


def _allreduce_ms_per_byte(cluster: Cluster, devices: list[int]) -> float:
    if len(devices) < 2:
        return 0.0
    bandwidths = [
        bw for a in devices for b in devices if (bw := cluster.bandwidth_gbps(a, b)) is not None
    ]
    if not bandwidths:
        return 0.0
    count = len(devices)
    return 2 * (count - 1) / count / gbps_to_bytes_per_ms(min(bandwidths))


def swap_times_ms(swap_bytes: int, ctx: StageContext) -> tuple[float, float]:
    """(swap-out, swap-in) time of one micro-batch's swapped bytes."""
    if not ctx.swaps_out:
        return 0.0, 0.0
    out = swap_bytes / ctx.host_out_bytes_per_ms if ctx.host_out_bytes_per_ms else 0.0
    back = swap_bytes / ctx.host_in_bytes_per_ms if ctx.host_in_bytes_per_ms else 0.0
    return out, back


def stall_ms(costs: StageCosts, ctx: StageContext) -> float:
    """Time a backward waits for its swapped tensors (see the module docstring)."""
    if not costs.swap_bytes or not ctx.swaps_out:
        return 0.0
    _, back = swap_times_ms(costs.swap_bytes, ctx)
    if ctx.schedule == "gpipe":
        return max(0.0, back - costs.bwd_ms - costs.recompute_ms)
    return max(0.0, back - costs.fwd_ms - costs.recompute_ms)


def stage_time_ms(costs: StageCosts, ctx: StageContext) -> float:
    """Time the stage spends per micro-batch of the pipeline (see the module docstring)."""
    out, back = swap_times_ms(costs.swap_bytes, ctx)
    compute = max(
        costs.fwd_ms + costs.bwd_ms + costs.recompute_ms + stall_ms(costs, ctx), out, back
    )
    allreduce = ctx.allreduce_ms_per_param_byte * costs.param_bytes
    if ctx.schedule == "pipedream":  # each replica: one micro-batch, update, all-reduce
        return (compute + costs.update_ms + allreduce) / ctx.replicas
    return compute / ctx.replicas + (costs.update_ms + allreduce) / ctx.num_microbatches


def stage_memory_bytes(costs: StageCosts, ctx: StageContext) -> int:
    """Peak memory of a replica of the stage (see the module docstring)."""
    static = costs.param_bytes * (2 + ctx.weight_versions - 1) + costs.optimizer_bytes
    activations = (
        ctx.inflight * costs.kept_bytes
        + costs.recompute_bytes
        + costs.workspace_bytes
        + ctx.swap_buffers * costs.swap_bytes
    )
    return static + activations


def link_time_ms(num_bytes: int, bandwidth_gbps: float | None) -> float:
    return transfer_ms(num_bytes, bandwidth_gbps)
