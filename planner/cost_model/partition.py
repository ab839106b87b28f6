"""Cut points of a chain scored stage by stage, for the planners that search by moving them.

A partition of a chain of n layers into K stages is its cut points ``bounds`` (0 = b_0 <
b_1 < ... < b_K = n). Stage s runs layers b_s..b_{s+1}-1 with the keep/recompute/swap
choice of a memory optimizer (``memopt_greedy``); its value is its time per micro-batch
and the transfer of its input from stage s-1, whichever is longer (``chain_model``). Local
searches try many partitions that share most stages, so values are cached per stage.
"""

import math
from collections.abc import Sequence

from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.cost_model.chain import ChainCosts, Solver, StageEvaluator, link_costs
from pipestudio.planner.cost_model.memopt.exact import KEEP


class PartitionCosts:
    """Stage values of a chain under one memory optimizer (see the module docstring)."""

    def __init__(self, request: PlanRequest, num_stages: int, solver: Solver) -> None:
        self.chain = ChainCosts.of(request)
        self.evaluator = StageEvaluator(self.chain, request.contexts([1] * num_stages))
        self.links = link_costs(request, self.chain, num_stages)
        self.solver = solver
        self.num_stages = num_stages
        self._values: dict[tuple[int, int, int], float] = {}

    @property
    def num_layers(self) -> int:
        return self.chain.num_layers

    def value(self, i: int, j: int, s: int) -> float:
        """Time per micro-batch of layers i..j-1 as stage s, its input transfer included;
        inf when the memory optimizer finds no choice that fits."""
        key = (i, j, s)
        known = self._values.get(key)
        if known is None:
            stage, _ = self.evaluator.solve(i, j, s, self.solver)
            known = self._values[key] = max(stage, self.links[s][i])
        return known

    def values(self, bounds: Sequence[int]) -> list[float]:
        return [self.value(bounds[s], bounds[s + 1], s) for s in range(len(bounds) - 1)]

    def bottleneck(self, bounds: Sequence[int]) -> float:
        return max(self.values(bounds))

    def policies(self, bounds: Sequence[int]) -> dict[int, str]:
        """The memory optimizer's non-keep policies for ``bounds``, by layer index."""
        result: dict[int, str] = {}
        for s in range(len(bounds) - 1):
            i, j = bounds[s], bounds[s + 1]
            _, choice = self.evaluator.solve(i, j, s, self.solver)
            if choice is not None:
                result.update({i + k: p for k, p in enumerate(choice.policies) if p != KEEP})
        return result

    def stages(self, bounds: Sequence[int]) -> list[list[int]]:
        return [list(range(bounds[s], bounds[s + 1])) for s in range(len(bounds) - 1)]


def leximax(values: Sequence[float]) -> tuple[float, ...]:
    """Values from the largest down: comparing these tuples prefers a smaller bottleneck,
    then a smaller second-largest stage, and so on (a balanced pipeline breaks ties)."""
    return tuple(sorted(values, reverse=True))


def is_finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(value) for value in values)
