"""Planners that split by counting or by balancing one number per layer.

``uniform``       equal layer counts (the first stages take one more when needed).
``balance-time``  torchgpipe's ``balance_by_time``: the block partition of per-layer time
                  (forward + backward).
``balance-size``  torchgpipe's ``balance_by_size``: the block partition of per-layer memory,
                  parameters with their gradient and optimizer copies plus the activations
                  of the micro-batches the first stage holds.

None of them changes a memory policy: every layer is kept. Their objective is the plan's
bottleneck under the stage model (``cost_model/stage.py``). For a non-sequential profile they
split the layers' topological order, so every edge still points forward.
"""

from pipestudio.planner.algorithms.blockpartition import block_partition
from pipestudio.planner.algorithms.request import PlannerOutput, PlanRequest, plan_cost


def _output(request: PlanRequest, ends: list[int], planner: str) -> PlannerOutput:
    starts = [0, *ends[:-1]]
    plan = request.build_plan(
        [list(range(a, b)) for a, b in zip(starts, ends, strict=True)], planner=planner
    )
    return PlannerOutput(plan, plan_cost(request, plan).bottleneck_ms)


def uniform(request: PlanRequest) -> PlannerOutput:
    num_stages = request.stages_required("uniform")
    base, extra = divmod(request.scaled.num_layers, num_stages)
    ends, end = [], 0
    for stage_idx in range(num_stages):
        end += base + (1 if stage_idx < extra else 0)
        ends.append(end)
    return _output(request, ends, "uniform")


def balance_time(request: PlanRequest) -> PlannerOutput:
    num_stages = request.stages_required("balance-time")
    times = [layer.fwd_ms + layer.bwd_ms for layer in request.scaled.layers]
    return _output(request, block_partition(times, num_stages), "balance-time")


def balance_size(request: PlanRequest) -> PlannerOutput:
    num_stages = request.stages_required("balance-size")
    held = request.contexts([1] * num_stages)[0].inflight
    state = 2 + request.optimizer_factor
    sizes = [
        float(layer.param_bytes * state + layer.saved_bytes * held)
        for layer in request.scaled.layers
    ]
    return _output(request, block_partition(sizes, num_stages), "balance-size")
