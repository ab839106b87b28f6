"""``vpipe``: vPipe's swap/recompute/repartition planner, SRP (Zhao et al., TPDS'22, §4).

vPipe plans in two coupled steps and repeats them:

- swap/recompute: each stage chooses its memory policies with vPipe's ranking
  (``memopt_greedy.solve_greedy``): swap the layers worst to recompute while the transfer
  hides under the stage's compute, then recompute the best-ranked layers until it fits;
- repartition: boundary layers move from the bottleneck stage to a neighbour while that
  lowers the pipeline's bottleneck (then its second-slowest stage, and so on: ``leximax``).

Moving layers only downhill stops at the first local minimum, so vPipe refines its
partition with Kernighan-Lin on a coarsened graph. Here a Kernighan-Lin pass moves every cut
point once, each time by the move that leaves the best pipeline even when it is worse than
before, and keeps the best partition it saw; passes repeat while one improves. The chain is
coarsened by moving cut points in steps of g layers, g = 2^L down to 1: coarse steps cross
long distances cheaply and the finest level settles the exact cut points. The first
partition is torchgpipe's time-balanced one. Profiles with edges are planned on their
sequential backbone (``cost_model/coarsen.py``), vPipe's coarsening of a graph into a chain.
"""

from pipestudio.planner.algorithms.blockpartition import block_partition
from pipestudio.planner.algorithms.request import InfeasibleError, PlannerOutput, PlanRequest
from pipestudio.planner.cost_model.coarsen import plan_on_backbone
from pipestudio.planner.cost_model.memopt.greedy import solve_greedy
from pipestudio.planner.cost_model.partition import PartitionCosts, is_finite, leximax

#: Kernighan-Lin passes per coarsening level at most (each pass moves every cut point once).
MAX_PASSES = 8

Bounds = list[int]


def vpipe(request: PlanRequest) -> PlannerOutput:
    num_stages = request.stages_required("vpipe")
    if not request.scaled.is_chain:
        return plan_on_backbone(request, vpipe)
    costs = PartitionCosts(request, num_stages, solve_greedy)
    count = costs.num_layers
    bounds = [0, *block_partition(costs.chain.layer_times(), num_stages)]
    step = 1
    while count // (2 * step) >= 4 * num_stages:
        step *= 2
    moves = 0
    while True:
        bounds, relieved = relieve_bottleneck(costs, bounds, step)
        bounds, shifted = kernighan_lin(costs, bounds, step)
        moves += relieved + shifted
        if step == 1:
            break
        step //= 2
    values = costs.values(bounds)
    if not is_finite(values):
        raise InfeasibleError(
            f"vpipe found no split into {num_stages} stages that fits the "
            "device memory, even recomputing or swapping layers"
        )
    plan = request.build_plan(costs.stages(bounds), costs.policies(bounds), planner="vpipe")
    return PlannerOutput(
        plan, max(values), {"moves": moves, "stages_evaluated": costs.evaluator.solved}
    )


def _moves(bounds: Bounds, cut: int, step: int) -> list[Bounds]:
    """Cut point ``cut`` moved by ``step`` layers either way, stages kept non-empty."""
    result = []
    for delta in (-step, step):
        moved = bounds[cut] + delta
        if bounds[cut - 1] < moved < bounds[cut + 1]:
            result.append([*bounds[:cut], moved, *bounds[cut + 1 :]])
    return result


def relieve_bottleneck(costs: PartitionCosts, bounds: Bounds, step: int) -> tuple[Bounds, int]:
    """Move ``step`` boundary layers off the slowest stage while the pipeline improves."""
    moves = 0
    key = leximax(costs.values(bounds))
    last = len(bounds) - 1
    while True:
        values = costs.values(bounds)
        slowest = values.index(max(values))
        options = [
            moved
            for cut in (slowest, slowest + 1)
            if 0 < cut < last
            for moved in _moves(bounds, cut, step)
        ]
        scored = [(leximax(costs.values(option)), option) for option in options]
        if not scored:
            return bounds, moves
        best_key, best = min(scored)
        if best_key >= key:
            return bounds, moves
        bounds, key, moves = best, best_key, moves + 1


def kernighan_lin(costs: PartitionCosts, bounds: Bounds, step: int) -> tuple[Bounds, int]:
    """Kernighan-Lin passes over the cut points (module docstring); (best bounds, moves)."""

    def score(candidate: Bounds) -> tuple[float, ...]:
        return leximax(costs.values(candidate))

    best, best_key, moves = bounds, score(bounds), 0
    for _ in range(MAX_PASSES):
        current, free = best, set(range(1, len(bounds) - 1))
        pass_best, pass_key, pass_moves = best, best_key, 0
        for taken in range(1, len(free) + 1):
            options = [
                (score(moved), cut, moved) for cut in free for moved in _moves(current, cut, step)
            ]
            if not options:
                break
            key, cut, current = min(options)
            free.discard(cut)
            if key < pass_key:
                pass_best, pass_key, pass_moves = current, key, taken
        if pass_key >= best_key:
            break
        best, best_key, moves = pass_best, pass_key, moves + pass_moves
    return best, moves
