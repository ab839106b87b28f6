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
(tests/planner/test_stage_model.py checks both on random stages).

Time per micro-batch, with F, B, R the forward, backward and recompute time and x, y the
swap-out and swap-in time of a micro-batch's swapped bytes::

    T_s = max(F + B + R + stall, x, y) + update per micro-batch

The fetch for a backward starts with the op before it, so it hides under that op and the
recompute: the stall is max(0, y - F - R) for 1F1B stages with a warm-up (the op before is
a forward), max(0, x + y - R) for the last stage (it fetches what it just sent out) and
max(0, y - B - R) for GPipe (the op before is a backward). The update is paid once per
micro-batch for pipedream and once per step, spread over m micro-batches, otherwise.
Replicas divide the stage time and add their all-reduce. A link between stages is a stage
of its own, taking bytes / bandwidth per micro-batch in each direction.
"""

from dataclasses import dataclass

from pipestudio.planner.cluster import Cluster
from pipestudio.planner.costs import StageCosts
from pipestudio.planner.plan import OPTIMIZER_STATE_FACTOR
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


def stage_contexts(schedule: str, replicas: list[int], num_microbatches: int, optimizer: str,
                   cluster: Cluster | None = None, devices: list[list[int]] | None = None
                   ) -> list[StageContext]:
    """Contexts of a pipeline's stages, in order (devices default to consecutive ones)."""
    if devices is None:
        devices, next_device = [], 0
        for count in replicas:
            devices.append(list(range(next_device, next_device + count)))
            next_device += count
    contexts = []
    for stage_idx, count in enumerate(replicas):
        later = sum(replicas[stage_idx:])
        warmup = (later - 1) // count
        per_replica = num_microbatches // count
        inflight = {"gpipe": per_replica, "1f1b": min(warmup + 1, per_replica)}.get(
            schedule, warmup + 1)
        memory = host_in = host_out = None
        allreduce = 0.0
        if cluster is not None:
            used = [cluster.devices[d] for d in devices[stage_idx]]
            limits = [d.memory_bytes for d in used if d.memory_bytes is not None]
            memory = min(limits) if limits else None
            host_in = _slowest(d.host_to_device_gbps for d in used)
            host_out = _slowest(d.device_to_host_gbps for d in used)
            allreduce = _allreduce_ms_per_byte(cluster, devices[stage_idx])
        contexts.append(StageContext(
            schedule=schedule, inflight=inflight, warmup=warmup, replicas=count,
            num_microbatches=num_microbatches,
            optimizer_factor=OPTIMIZER_STATE_FACTOR[optimizer], memory_bytes=memory,
            host_in_bytes_per_ms=host_in, host_out_bytes_per_ms=host_out,
            allreduce_ms_per_param_byte=allreduce))
    return contexts


def _slowest(values: object) -> float | None:
    rates = [gbps_to_bytes_per_ms(v) for v in values if v is not None]  # type: ignore[attr-defined]
    return min(rates) if rates else None


def _allreduce_ms_per_byte(cluster: Cluster, devices: list[int]) -> float:
    if len(devices) < 2:
        return 0.0
    bandwidths = [bw for a in devices for b in devices
                  if (bw := cluster.bandwidth_gbps(a, b)) is not None]
    if not bandwidths:
        return 0.0
    count = len(devices)
    return 2 * (count - 1) / count / gbps_to_bytes_per_ms(min(bandwidths))


def swap_times_ms(swap_bytes: int, ctx: StageContext) -> tuple[float, float]:
    """(swap-out, swap-in) time of one micro-batch's swapped bytes."""
    out = swap_bytes / ctx.host_out_bytes_per_ms if ctx.host_out_bytes_per_ms else 0.0
    back = swap_bytes / ctx.host_in_bytes_per_ms if ctx.host_in_bytes_per_ms else 0.0
    return out, back


def stall_ms(costs: StageCosts, ctx: StageContext) -> float:
    """Time a backward waits for its swapped tensors (see the module docstring)."""
    if not costs.swap_bytes:
        return 0.0
    out, back = swap_times_ms(costs.swap_bytes, ctx)
    if ctx.schedule == "gpipe":
        return max(0.0, back - costs.bwd_ms - costs.recompute_ms)
    if ctx.warmup == 0:
        return max(0.0, out + back - costs.recompute_ms)
    return max(0.0, back - costs.fwd_ms - costs.recompute_ms)


def stage_time_ms(costs: StageCosts, ctx: StageContext) -> float:
    """Time the stage spends per micro-batch of the pipeline (see the module docstring)."""
    out, back = swap_times_ms(costs.swap_bytes, ctx)
    compute = max(costs.fwd_ms + costs.bwd_ms + costs.recompute_ms + stall_ms(costs, ctx),
                  out, back)
    allreduce = ctx.allreduce_ms_per_param_byte * costs.param_bytes
    if ctx.schedule == "pipedream":  # each replica: one micro-batch, update, all-reduce
        return (compute + costs.update_ms + allreduce) / ctx.replicas
    return compute / ctx.replicas + (costs.update_ms + allreduce) / ctx.num_microbatches


def stage_memory_bytes(costs: StageCosts, ctx: StageContext) -> int:
    """Peak memory of a replica of the stage (see the module docstring)."""
    static = costs.param_bytes * (2 + ctx.weight_versions - 1) + costs.optimizer_bytes
    activations = (ctx.inflight * costs.kept_bytes + costs.recompute_bytes
                   + costs.workspace_bytes + ctx.swap_buffers * costs.swap_bytes)
    return static + activations


def link_time_ms(num_bytes: int, bandwidth_gbps: float | None) -> float:
    return transfer_ms(num_bytes, bandwidth_gbps)
