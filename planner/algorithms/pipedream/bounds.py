"""Lower bounds that let ``dp.py`` skip candidates of PipeDream's DP exactly.

Notation as in ``dp.py`` (SOSP'19 §3.1). Every bound holds for every candidate the
optimizer considers, irregular first stages included:

- a stage's time is at least its compute over its machines below and its own replicas, plus
  its all-reduce: ((C(s_j) - C(s_k) - E_{l-1}) / M_l + 4 (m'-1) (P(s_j) - P(s_k)) / (B m')) / m';
- a prefix on m+1 machines is at least (C(s_k) - C(s_{i-1}) - E_l) / (M_l (m+1)): its stage
  times, weighted by their replicas, add up to at least the compute in it;
- a prefix on q machines holds at most caps_l[q] bytes of A + P beyond A(s_{i-1}) + P(s_{i-1}):
  a stage ending at machine u with r replicas stashes ceil((N - u) / r) copies, so holds at
  most M / that, and these sums telescope (caps_l[q] is the best such sum over the ways of
  cutting q machines into stages);
- with a memory size, ``reach.py`` refuses entries that no plan can finish in time;

where M_l is the product of the machine counts below level l, W_l the machine count of the
level below (1 at level 1) and E_l bounds how much the irregular first stages (whose parameter
difference can be negative) can lower a sum. Each bound is lowered by a slack far above the
rounding of the sums it rearranges, so it never rejects a candidate that the optimizer's own
floating-point arithmetic would keep.
"""

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pipestudio.planner.algorithms.pipedream.order import AncestorOrder
from pipestudio.planner.algorithms.pipedream.reach import ChainReach

if TYPE_CHECKING:
    from pipestudio.planner.algorithms.pipedream.dp import Level, StateCosts

INF = math.inf
#: Relative slack on cutoffs and bounds: covers the rounding of sums that bounds rearrange.
SLACK = 1e-9


def loosen(value: float) -> float:
    return value + abs(value) * SLACK


def memory_caps(machines: int, memory_bytes: float | None, single_replica: bool) -> list[float]:
    """caps[q]: the most A + P bytes the first q machines of a level can hold, q < machines."""
    caps = [0.0] + [INF] * (machines - 1)
    if memory_bytes is None:
        return caps
    for used in range(1, machines):
        caps[used] = max(
            caps[used - replicas] + memory_bytes / math.ceil((machines - used) / replicas)
            for replicas in range(1, 2 if single_replica else used + 1)
        )
    return caps


def _largest_drop(parameter_bytes: Sequence[float]) -> float:
    """The largest P(s_{i-1}) - P(s_k) over rows i >= 1 and k >= i (0 if none is positive)."""
    suffix_min, drop = INF, 0.0
    for state in range(len(parameter_bytes) - 1, 0, -1):
        suffix_min = min(suffix_min, parameter_bytes[state])
        drop = max(drop, parameter_bytes[state - 1] - suffix_min)
    return drop


class SearchBounds:
    """The bounds above for one set of state costs, levels and memory size."""

    def __init__(
        self,
        costs: "StateCosts",
        levels: Sequence["Level"],
        *,
        memory_bytes: float | None,
        single_replica: bool,
    ) -> None:
        self.costs, self.levels, self.memory_bytes = costs, levels, memory_bytes
        drop = _largest_drop(costs.parameter_bytes)
        self.below: list[int] = []  # M_l
        self.width: list[int] = []  # W_l
        self.shortfall: list[float] = []  # E_l
        below, width, shortfall = 1, 1, 0.0
        for level in levels:
            machines, bandwidth = level.num_machines, level.bandwidth_bytes_per_s
            first_dp = 4 * (machines - 1) * drop / (bandwidth * machines * width)
            shortfall = machines * shortfall + below * first_dp
            self.below.append(below)
            self.width.append(width)
            self.shortfall.append(shortfall)
            below *= machines
            width = machines
        total = costs.compute_s[-1] if costs.compute_s else 0.0
        self.abs_slack = SLACK * (total + shortfall) + 1e-300
        self.byte_slack = SLACK * max(
            (
                abs(act) + abs(par)
                for act, par in zip(costs.activation_bytes, costs.parameter_bytes, strict=True)
            ),
            default=0.0,
        )
        self.caps = [
            memory_caps(level.num_machines, memory_bytes, single_replica) for level in levels
        ]
        self.reach = (
            None
            if memory_bytes is None
            else ChainReach(
                costs,
                levels,
                memory_bytes=memory_bytes,
                single_replica=single_replica,
                below=self.below,
                width=self.width,
                shortfall=self.shortfall,
                relative_slack=SLACK,
                abs_slack_s=self.abs_slack,
                abs_slack_bytes=self.byte_slack,
            )
        )

    def may_finish(self, lv: int, row: int, col: int, m: int, limit: float) -> bool:
        """False only when A_lv[row][col][m] > ``limit``."""
        if self.reach is None or m == 0 or limit == INF or not self.reach.applies(row, col):
            return True
        return self.reach.may_finish(lv, row, col, m, limit)

    def crossing(self, lv: int, row: int, col: int, prefix: int, replicas: int) -> float:
        """The C(s_k) where the prefix bound and the stage bound (compute only) meet."""
        comp = self.costs.compute_s
        start, short = comp[row - 1] if row > 0 else 0.0, self.shortfall[lv]
        end, short_below = comp[col], self.shortfall[lv - 1] if lv else 0.0
        return (prefix * (end - short_below) + replicas * (start + short)) / (prefix + replicas)

    def stage(
        self, lv: int, col: int, m: int, replicas: int, order: AncestorOrder
    ) -> Callable[[int, float], float]:
        """bound(idx, limit): lower bound on the last stage after the state at ``order``
        position idx, or INF when it cannot fit the memory or beat ``limit``.

        Non-increasing in idx: the C and the running maximum of P and of A + P of the ancestors
        only grow along the order, so the stage's time and stash bounds only shrink.
        """
        costs, level = self.costs, self.levels[lv]
        comp, peak_par, peak_held = order.compute_s, order.peak_par_bytes, order.peak_held_bytes
        end_held = costs.activation_bytes[col] + costs.parameter_bytes[col]
        stash = math.ceil((level.num_machines - (m + 1)) / replicas)
        room = INF if self.memory_bytes is None or stash == 0 else loosen(self.memory_bytes / stash)
        below, slack = self.below[lv], self.abs_slack
        short_below = self.shortfall[lv - 1] if lv else 0.0
        end, end_par = costs.compute_s[col], costs.parameter_bytes[col]
        per_byte = 4 * (replicas - 1) / (level.bandwidth_bytes_per_s * replicas)

        def bound(idx: int, limit: float) -> float:
            value = (
                (end - comp[idx] - short_below) / below + per_byte * (end_par - peak_par[idx])
            ) / replicas - slack
            return INF if value >= limit or end_held - peak_held[idx] > room else value

        return bound

    def prefix_room(self, lv: int, row: int, prefix: int) -> float:
        """The most A(s_k) + P(s_k) with which states row..k can fit on ``prefix`` machines."""
        if self.memory_bytes is None:
            return INF
        costs = self.costs
        start_held = (
            costs.activation_bytes[row - 1] + costs.parameter_bytes[row - 1] if row > 0 else 0.0
        )
        return start_held + loosen(self.caps[lv][prefix]) + self.byte_slack

    def prefix(
        self, lv: int, row: int, prefix: int, order: AncestorOrder
    ) -> Callable[[int], float]:
        """bound(idx): lower bound on states row..k on ``prefix`` machines for the state at
        ``order`` position idx and every later one, INF when none of them fits the memory.

        Non-decreasing in idx; ``rest_min_held_bytes`` is a minimum over the later positions.
        """
        comp, rest_held = order.compute_s, order.rest_min_held_bytes
        start = self.costs.compute_s[row - 1] if row > 0 else 0.0
        scale, short, slack = self.below[lv] * prefix, self.shortfall[lv], self.abs_slack
        room = self.prefix_room(lv, row, prefix)

        def bound(idx: int) -> float:
            return INF if rest_held[idx] > room else (comp[idx] - start - short) / scale - slack

        return bound
