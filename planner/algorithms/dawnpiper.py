"""``dawnpiper``: DawnPiper's memory-aware binary partition (Peng et al. 2025, §4).

Layers differ in how much compute they cost per byte of memory they hold, and 1F1B-style
schedules hold more micro-batches on early stages than on late ones, so a partition that
balances compute leaves memory unbalanced and the other way round. For two adjacent parts
of a pipeline, DawnPiper calls the cut that gives both equal compute per device the
compute-balanced point p_c, and the cut that gives both equal memory per device the
memory-balanced point p_m; its partitioning theorem places the best cut, once a memory
optimizer may recompute or swap, between the two.

BiPar, the binary partition: split the stages into two halves (the first gets the smaller
half), find p_c and p_m for the two halves, search between them for the cut with the
smallest bottleneck, and recurse into each half. Moving the cut towards one half makes that
half slower and the other faster, so the search is a binary search for where the two cross.
A half of several stages is judged by its own compute-balanced split. Every stage chooses
its memory policies with DawnPiper's Capuchin-style cost model
(``memopt_greedy.solve_capuchin``).

Memory per device of a half counts, for each of its layers, parameters with their gradient,
optimizer state and stashed versions, and the saved bytes of the micro-batches in flight,
both averaged over the half's stage positions. Profiles with edges are planned on their
sequential backbone (``cost_model/coarsen.py``).
"""

import bisect

from pipestudio.planner.algorithms.blockpartition import block_partition
from pipestudio.planner.algorithms.request import InfeasibleError, PlannerOutput, PlanRequest
from pipestudio.planner.cost_model.coarsen import plan_on_backbone
from pipestudio.planner.cost_model.memopt.greedy import solve_capuchin
from pipestudio.planner.cost_model.partition import PartitionCosts, is_finite


def dawnpiper(request: PlanRequest) -> PlannerOutput:
    num_stages = request.stages_required("dawnpiper")
    if not request.scaled.is_chain:
        return plan_on_backbone(request, dawnpiper)
    costs = PartitionCosts(request, num_stages, solve_capuchin)
    bounds = [0] * num_stages + [costs.num_layers]
    _bipar(costs, 0, costs.num_layers, 0, num_stages, bounds)
    values = costs.values(bounds)
    if not is_finite(values):
        raise InfeasibleError(
            f"dawnpiper found no split into {num_stages} stages that fits "
            "the device memory, even recomputing or swapping layers"
        )
    plan = request.build_plan(costs.stages(bounds), costs.policies(bounds), planner="dawnpiper")
    return PlannerOutput(plan, max(values), {"stages_evaluated": costs.evaluator.solved})


def _bipar(
    costs: PartitionCosts, start: int, end: int, first: int, count: int, bounds: list[int]
) -> None:
    """Cut layers start..end-1 into ``count`` stages from stage ``first`` on (into bounds)."""
    if count == 1:
        return
    left = count // 2
    right = count - left
    low, high = start + left, end - right  # each half keeps a layer per stage
    compute = _balanced_point(costs, start, end, first, left, right, memory=False)
    memory = _balanced_point(costs, start, end, first, left, right, memory=True)
    low, high = max(low, min(compute, memory)), min(high, max(compute, memory))

    def halves(cut: int) -> tuple[float, float]:
        return (
            group_bottleneck(costs, start, cut, first, left),
            group_bottleneck(costs, cut, end, first + left, right),
        )

    while low < high:  # the first cut at which the left half is the slower one
        middle = (low + high) // 2
        slow_left, slow_right = halves(middle)
        if slow_left >= slow_right:
            high = middle
        else:
            low = middle + 1
    candidates = [cut for cut in (low - 1, low) if start + left <= cut <= end - right]
    cut = min(candidates, key=lambda c: (max(halves(c)), abs(c - compute)))
    bounds[first + left] = cut
    _bipar(costs, start, cut, first, left, bounds)
    _bipar(costs, cut, end, first + left, right, bounds)


def _balanced_point(
    costs: PartitionCosts, start: int, end: int, first: int, left: int, right: int, *, memory: bool
) -> int:
    """The cut where both halves need the same compute (or memory) per device."""
    chain = costs.chain
    if memory:
        weights = [_memory_weights(costs, first + s) for s in range(left + right)]
        left_w, right_w = _mean(weights[:left]), _mean(weights[left:])

        def load(i: int, j: int, w: tuple[float, float]) -> float:
            return (chain.params[j] - chain.params[i]) * w[0] + (
                chain.saved[j] - chain.saved[i]
            ) * w[1]

        def excess(cut: int) -> float:
            return load(start, cut, left_w) / left - load(cut, end, right_w) / right
    else:

        def excess(cut: int) -> float:
            return chain.base_ms(start, cut) / left - chain.base_ms(cut, end) / right

    cuts = range(start + left, end - right + 1)
    position = bisect.bisect_left(cuts, 0.0, key=excess)
    return cuts[min(position, len(cuts) - 1)]


def _memory_weights(costs: PartitionCosts, s: int) -> tuple[float, float]:
    """Bytes a stage at position s holds per parameter byte and per saved byte."""
    ctx = costs.evaluator.contexts[s]
    return 2 + ctx.optimizer_factor + ctx.weight_versions - 1, float(ctx.inflight)


def _mean(weights: list[tuple[float, float]]) -> tuple[float, float]:
    return (sum(w[0] for w in weights) / len(weights), sum(w[1] for w in weights) / len(weights))


def group_bottleneck(costs: PartitionCosts, start: int, end: int, first: int, count: int) -> float:
    """The slowest stage of layers start..end-1 split into ``count`` compute-balanced
    stages from position ``first`` on."""
    if count == 1:
        return costs.value(start, end, first)
    times = costs.chain.layer_times()[start:end]
    ends = [start + e for e in block_partition(times, count)]
    bounds = [start, *ends]
    return max(costs.value(bounds[s], bounds[s + 1], first + s) for s in range(count))
