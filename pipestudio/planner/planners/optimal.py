"""``optimal``: the smallest bottleneck over every partition and every memory policy.

For a chain of layers and K stages, a dynamic program over prefixes (PipeDream §3.1 does
the same over its cost model) finds

    best(s, j) = min over i < j of max(best(s - 1, i), link(i), stage(i, j, s))

where stage(i, j, s) is the time per micro-batch of layers i..j-1 as stage s with their
fastest keep/recompute/swap choice that fits the device memory, and link(i) the transfer
of layer i-1's output to the next stage. Memory (through the micro-batches in flight) and
the swap stall depend on the stage's position, so the program keeps s.

The stage subproblem is solved exactly (``memopt.solve_exact``) for stages of up to
``EXACT_MAX_LAYERS`` layers, and otherwise by ``memopt_bounded.solve_bounded``: a choice
together with a proven lower bound on the best one. When any stage of the search was not
solved exactly, the program runs a second time on those lower bounds, which bounds the
optimum itself from below: the objective is then proven within ``gap`` of the best
possible (``details``; a gap of 0 means optimal).

The program is fast because most candidates are settled without solving their memory
subproblem:

- an upper bound U comes first, from time-balanced stages given a greedy memory choice
  (``memopt_greedy.solve_greedy``); no value above U can be part of the answer;
- stage(i, j, s) is at least the forward and backward time of its layers, which grows as i
  moves back, so for each j only the starts within U of it are tried, and only the ends j
  that leave room for the other stages within U;
- inside the window a stage is settled in O(1) when keeping every layer fits, or when
  swapping within the free transfer time frees enough, or when a lower bound (every byte
  freed at the best rate the stage offers) already loses; otherwise the subproblem runs
  with the best value so far as its cutoff and the head max(best(s - 1, i), link(i)) as its
  floor;
- a stage that cannot fit even recomputing every layer (its parameters, workspace and one
  micro-batch of saved bytes exceed the memory) ends the scan of starts for its j, since
  earlier starts only add to each of those.

Profiles with edges are planned on their sequential backbone (``coarsen.py``).
"""

import bisect
import math
from collections.abc import Callable

from pipestudio.planner.chain_model import ChainCosts, StageEvaluator, link_costs
from pipestudio.planner.coarsen import plan_on_backbone
from pipestudio.planner.memopt import KEEP, StageChoice, StageProblem, solve_exact
from pipestudio.planner.memopt_bounded import lower_bound_ms, solve_bounded
from pipestudio.planner.memopt_greedy import solve_greedy
from pipestudio.planner.planners.blockpartition import block_partition
from pipestudio.planner.request import InfeasibleError, PlannerOutput, PlanRequest

#: Stages with at most this many layers get the exact subproblem (3^12 policy choices).
EXACT_MAX_LAYERS = 12

# stage(i, j, s, head, current) -> its value, or anything >= current when it cannot win
_StageValue = Callable[[int, int, int, float, float], float]


def solve_stage(problem: StageProblem, cutoff_ms: float = math.inf,
                floor_ms: float = -math.inf) -> StageChoice | None:
    """The stage subproblem: exact for small stages, bounded for large ones."""
    if len(problem.fwd_ms) <= EXACT_MAX_LAYERS:
        return solve_exact(problem, cutoff_ms, max_states=1 << 16, floor_ms=floor_ms)
    return solve_bounded(problem, cutoff_ms, floor_ms)


class _Search:
    """The stage values the program asks for: chosen ones (kept for the plan) and proven
    lower bounds of them."""

    def __init__(self, stages: StageEvaluator) -> None:
        self.stages = stages
        self.choices: dict[tuple[int, int, int], StageChoice] = {}
        self.bounds: dict[tuple[object, ...], float] = {}

    def lower_bound(self, i: int, j: int, s: int) -> float:
        """The bounded subproblem's lower bound, without the update, once per problem."""
        key = (i, j, *self.stages.context_key(s))
        bound = self.bounds.get(key)
        if bound is None:
            bound = self.bounds[key] = lower_bound_ms(self.stages.problem(i, j, s))
        return bound

    def _solve(self, i: int, j: int, s: int, head: float, current: float
               ) -> tuple[float, StageChoice | None]:
        stages = self.stages
        update = stages.update_ms(i, j, s)
        if j - i <= EXACT_MAX_LAYERS:
            stages.solved += 1
            choice = solve_exact(stages.problem(i, j, s), current - update, max_states=1 << 16,
                                 floor_ms=head - update)
        else:
            lower = self.lower_bound(i, j, s)
            if lower + update > current:
                return math.inf, None
            stages.solved += 1
            choice = solve_bounded(stages.problem(i, j, s), current - update, head - update,
                                   lower)
        if choice is None:
            return math.inf, None
        stages.proven = stages.proven and choice.exact
        return choice.time_ms + update, choice

    def chosen(self, i: int, j: int, s: int, head: float, current: float) -> float:
        value, choice = self._solve(i, j, s, head, current)
        if choice is not None:
            self.choices[(i, j, s)] = choice
        return value

    def lower(self, i: int, j: int, s: int, head: float, current: float) -> float:
        if j - i <= EXACT_MAX_LAYERS:
            return self._solve(i, j, s, head, current)[0]
        return self.lower_bound(i, j, s) + self.stages.update_ms(i, j, s)

    def choice(self, i: int, j: int, s: int, value: float) -> StageChoice:
        """The choice behind stage(i, j, s) = ``value`` in the program's answer."""
        known = self.choices.get((i, j, s))
        if known is None:  # settled by its bounds: keep all, or swap within free time
            update = self.stages.update_ms(i, j, s)
            known = solve_stage(self.stages.problem(i, j, s), floor_ms=value - update)
        assert known is not None
        return known


def optimal(request: PlanRequest) -> PlannerOutput:
    num_stages = request.stages_required("optimal")
    if not request.scaled.is_chain:
        return plan_on_backbone(request, optimal)
    chain = ChainCosts.of(request)
    stages = StageEvaluator(chain, request.contexts([1] * num_stages))
    links = link_costs(request, chain, num_stages)
    search = _Search(stages)
    upper = _upper_bound(chain, stages, links, num_stages)
    best, back = _program(chain, stages, links, num_stages, upper, search.chosen,
                          gallop=True)
    count = chain.num_layers
    objective = best[num_stages][count]
    if math.isinf(objective):
        raise InfeasibleError(
            f"no split into {num_stages} stages fits the device memory, even recomputing or "
            f"swapping layers")
    partition = _partition(back, num_stages, count)
    policies: dict[int, str] = {}
    objective = 0.0  # the plan's own bottleneck, at most the program's value
    for s, layers in enumerate(partition):
        i, j = layers[0], layers[-1] + 1
        choice = search.choice(i, j, s, best[num_stages][count])
        policies.update({i + k: p for k, p in enumerate(choice.policies) if p != KEEP})
        objective = max(objective, choice.time_ms + stages.update_ms(i, j, s), links[s][i])
    lower = objective
    if not stages.proven:
        lower = _program(chain, stages, links, num_stages, objective, search.lower,
                         gallop=False)[0][num_stages][count]
    gap = objective / lower - 1 if lower > 0 else 0.0
    details = {"exact": stages.proven, "lower_bound_ms": lower, "gap": gap,
               "subproblems_solved": stages.solved}
    plan = request.build_plan(partition, policies, planner="optimal",
                              settings={"exact": stages.proven, "gap": gap})
    return PlannerOutput(plan, objective, details)


def _program(chain: ChainCosts, stages: StageEvaluator, links: list[list[float]],
             num_stages: int, upper: float, stage_value: _StageValue, *, gallop: bool
             ) -> tuple[list[list[float]], list[list[int]]]:
    """best(s, j) and the start i that achieves it (the module docstring's program).

    ``gallop`` lets the scan of starts assume, for stages of more than ``EXACT_MAX_LAYERS``
    layers, that a stage is no faster with more layers: see ``_Scan.gallop``.
    """
    count = chain.num_layers
    limit = upper * (1 + 1e-12)
    base = [f + b for f, b in zip(chain.fwd, chain.bwd, strict=True)]  # prefix sums
    best = [[math.inf] * (count + 1) for _ in range(num_stages + 1)]
    back = [[-1] * (count + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        # j must leave at most (K - s) stages of work at or under the bound, and take at most
        # s such stages before it.
        first = max(s, bisect.bisect_left(base, base[count] - (num_stages - s) * limit))
        last = min(count - (num_stages - s), bisect.bisect_right(base, s * limit) - 1)
        for j in range(first, last + 1):
            scan = _Scan(stages, stage_value, base, best[s - 1], links[s - 1], s, j, limit)
            small = max(s - 1, j - EXACT_MAX_LAYERS)
            if gallop and small > s - 1:  # large stages first: their best prunes the rest
                scan.gallop(small - 1)
                scan.run(j - 1, small)
            elif scan.run(j - 1, small) and small > s - 1:
                scan.run(small - 1, s - 1)
            best[s][j], back[s][j] = (scan.current, scan.start) if scan.start >= 0 else (
                math.inf, -1)
    return best, back


class _Scan:
    """The starts i of stage s - 1 that end at layer j, best first found."""

    def __init__(self, stages: StageEvaluator, stage_value: _StageValue, base: list[float],
                 previous: list[float], link: list[float], s: int, j: int,
                 limit: float) -> None:
        self.stages, self.stage_value, self.base = stages, stage_value, base
        self.previous, self.link, self.s, self.j = previous, link, s, j
        self.current, self.start = limit, -1

    def head(self, i: int) -> float:
        return max(self.previous[i], self.link[i])

    def run(self, high: int, low: int, *, monotone: bool = False) -> bool:
        """Try starts high, high - 1, ..., low; False once no earlier start can win.
        ``monotone``: assume the stage only gets slower with earlier starts."""
        base, j = self.base, self.j
        for i in range(high, low - 1, -1):
            if base[j] - base[i] >= self.current:
                return False  # earlier starts only add work
            if not self.consider(i, monotone=monotone):
                return False
        return True

    def consider(self, i: int, *, monotone: bool = False) -> bool:
        """Start i as a candidate; False when no earlier start can win: the stage cannot fit
        even at its bare minimum, which earlier starts only add to, or (``monotone``) it is
        already slower than the best found."""
        head = self.head(i)
        if head >= self.current:
            return True
        low, settled = self.stages.bounds(i, self.j, self.s - 1)
        if low >= self.current:
            return not monotone and low != math.inf
        if not settled:
            low = self.stage_value(i, self.j, self.s - 1, head, self.current)
            if monotone and low >= self.current:
                return False
        value = head if head > low else low
        if value < self.current:
            self.current, self.start = value, i
        return True

    def gallop(self, high: int) -> None:
        """Starts high, high - 1, ... of stages too large for the exact subproblem.

        Assuming a stage gets no faster as it takes more layers, the starts where the stage
        is within the previous stages' best, fits(i), come last (near j) and the best of them
        is the earliest, i0, found by binary search: before it only i0's head counts, after
        it the stage grows, so the plain scan resumes at i0 - 1. The program on lower bounds
        makes no such assumption, so the proven gap holds whatever the stages do.
        """
        base, j, s = self.base, self.j, self.s
        low = max(s - 1, bisect.bisect_right(base, base[j] - self.current))
        if low > high:
            return

        def fits(i: int) -> bool:
            within = self.previous[i]
            if within == math.inf:
                return True
            low, settled = self.stages.bounds(i, j, s - 1)
            if settled or low > within:
                return low <= within
            return self.stage_value(i, j, s - 1, within, within) <= within

        if not fits(high):
            self.run(high, s - 1, monotone=True)
            return
        top = high
        while low < high:  # the earliest start that fits, in [low, top]
            middle = (low + high) // 2
            if fits(middle):
                high = middle
            else:
                low = middle + 1
        self.consider(high)
        for i in range(high + 1, top + 1):  # later starts: larger heads, maybe smaller links
            if self.previous[i] >= self.current:
                break
            if self.link[i] < self.current:
                self.consider(i)
        self.run(high - 1, s - 1, monotone=True)


def _upper_bound(chain: ChainCosts, stages: StageEvaluator, links: list[list[float]],
                 num_stages: int) -> float:
    """The bottleneck of time-balanced stages with greedy memory choices (inf if one does
    not fit): any value above it cannot be part of the optimum."""
    ends = block_partition(chain.layer_times(), num_stages)
    value, start = 0.0, 0
    for s, end in enumerate(ends):
        low, settled = stages.bounds(start, end, s)
        if not settled:
            choice = solve_greedy(stages.problem(start, end, s))
            if choice is None:
                return math.inf
            low = choice.time_ms + stages.update_ms(start, end, s)
        value = max(value, low, links[s][start] if s else 0.0)
        start = end
    return value


def _partition(back: list[list[int]], num_stages: int, count: int) -> list[list[int]]:
    partition: list[list[int]] = []
    j = count
    for s in range(num_stages, 0, -1):
        i = back[s][j]
        partition.append(list(range(i, j)))
        j = i
    partition.reverse()
    return partition
