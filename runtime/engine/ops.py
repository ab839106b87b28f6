"""The op sequence of one worker: its schedule's forwards and backwards, all-reduces, updates.

The forwards and backwards come from ``pipestudio.planner.simulator.schedule.worker_order``, the
order the simulator uses, so a measured timeline lines up with the predicted one:

- ``gpipe`` and ``1f1b`` run one step at a time (a flush), then all-reduce the gradients
  among the stage's replicas and update once;
- ``zero-bubble`` (ZB-H1) runs one step at a time as ``1f1b`` does, with each backward
  split into its input-gradient half (``backward``) and its weight-gradient half
  (``weight``), which stage s runs s backwards later (``zero_bubble_order``);
- ``pipedream`` (Narayanan et al. SOSP'19, §3.3) runs the micro-batches of many steps as one
  stream without a flush, and follows every backward with an all-reduce (replicated stages)
  and an update. The stream is cut only where a checkpoint is due, so that a checkpoint
  holds no micro-batch in flight (``segments``).

Micro-batch ``k`` of step ``t`` has the global index ``t * num_microbatches + k``.
"""

from dataclasses import dataclass

from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.simulator.schedule import (
    BACKWARD,
    FORWARD,
    WEIGHT,
    worker_order,
    zero_bubble_order,
)


@dataclass(frozen=True)
class Op:
    """``kind`` is forward, backward, weight, allreduce or update; ``microbatch`` is None
    for a synchronous step's all-reduce and update."""

    kind: str
    microbatch: int | None
    step: int


def segments(
    plan: Plan, start_step: int, end_step: int, checkpoint_every: int
) -> list[tuple[int, int]]:
    """(first step, number of steps) of each run of steps that ends flushed."""
    if plan.schedule != "pipedream":
        return [(step, 1) for step in range(start_step, end_step)]
    cuts = {end_step}
    if checkpoint_every > 0:
        cuts.update(range(checkpoint_every, end_step, checkpoint_every))
    bounds = sorted(cut for cut in cuts if cut > start_step)
    result, first = [], start_step
    for cut in bounds:
        result.append((first, cut - first))
        first = cut
    return result


def _microbatches(
    plan: Plan, stage_idx: int, replica: int, first_step: int, num_steps: int
) -> list[int]:
    replicas = plan.stages[stage_idx].replicas
    first = first_step * plan.num_microbatches
    last = first + num_steps * plan.num_microbatches
    return [mb for mb in range(first, last) if mb % replicas == replica]


def worker_ops(
    plan: Plan, stage_idx: int, replica: int, first_step: int, num_steps: int
) -> list[Op]:
    """Every op of worker (stage, replica) over the segment of ``num_steps`` steps."""
    replicated = plan.stages[stage_idx].replicas > 1
    mbs = _microbatches(plan, stage_idx, replica, first_step, num_steps)
    warmup = plan.warmup_forwards(stage_idx)
    num_microbatches = plan.num_microbatches
    ops: list[Op] = []
    if plan.schedule == "pipedream":
        for kind, mb in worker_order("pipedream", mbs, warmup):
            if kind == FORWARD:
                ops.append(Op("forward", mb, mb // num_microbatches))
                continue
            ops.append(Op("backward", mb, mb // num_microbatches))
            if replicated:
                ops.append(Op("allreduce", mb, mb // num_microbatches))
            ops.append(Op("update", mb, mb // num_microbatches))
        return ops
    kinds = {FORWARD: "forward", BACKWARD: "backward", WEIGHT: "weight"}
    for step in range(first_step, first_step + num_steps):
        step_mbs = [mb for mb in mbs if mb // num_microbatches == step]
        if plan.schedule == "zero-bubble":
            order = zero_bubble_order(step_mbs, warmup, stage_idx)
        else:
            order = worker_order(plan.schedule, step_mbs, warmup)
        ops.extend(Op(kinds[kind], mb, step) for kind, mb in order)
        if replicated:
            ops.append(Op("allreduce", None, step))
        ops.append(Op("update", None, step))
    return ops


def first_stage_versions(plan: Plan, first_step: int, num_steps: int) -> dict[int, int]:
    """Vertical sync (PipeDream §3.3): for every micro-batch of a pipedream segment, the
    version of stage 0's weights its forward used, counted in micro-batches whose gradients
    those weights include.

    The segment starts flushed, so every stage's weights then include all earlier
    micro-batches; each update of stage 0 adds one round of its ``r`` replicas' micro-batches.
    Every later stage runs the micro-batch on its own latest version that includes no more
    micro-batches than this, which with one replica per stage is PipeDream's version number.
    """
    replicas = plan.stages[0].replicas
    versions: dict[int, int] = {}
    for replica in range(replicas):
        mbs = _microbatches(plan, 0, replica, first_step, num_steps)
        applied = first_step * plan.num_microbatches
        for kind, mb in worker_order("pipedream", mbs, plan.warmup_forwards(0)):
            if kind == BACKWARD:
                applied += replicas
            else:
                versions[mb] = applied
    return versions
