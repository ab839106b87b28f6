"""How far a pipeline within a time limit can get: a fast refusal for PipeDream's DP entries.

With a memory size, the first stages of a level can hold little (a stage stashes one copy of
its activations and parameters per machine after it, SOSP'19 §3.1), so the compute bounds of
``dp.py`` (work over machines) are far below the true optimum and the branch and bound
walks long windows of split points that lose. This module answers, for an entry A_l[i][j][m]
and a time limit T, whether some plan of states i..j on m+1 machines *might* take at most T;
"no" lets the DP skip the entry.

It is a relaxation of the DP on a run of states along which C, P and A + P never drop (every
state of a chain; a block of a residual network): there a stage's lower-bound time and its
stash grow with its last state and shrink with its first, so a stage that starts later can
end at least as late. Let reach[u] bound the last state of any plan of i..k on exactly the
first u machines; then

    reach[u] <= max over replicas r of (reach[u-r], the last k such that states
                reach[u-r]+1..k on r replicas, ending at machine u, fit the memory and the
                bound ((C(s_k) - C(s_p) - E_{l-1}) / M_l + 4 (r-1) (P(s_k) - P(s_p)) / (B r)) / r
                of the DP's stage time is at most T)

with the one-stage plan (its all-reduce divided by W, as the DP does) for r = u, and the
plan exists only if reach[m+1] >= j. Communication is left out and the bounds carry the DP's
slack, so "no" is always right; "yes" decides nothing.
"""

import bisect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipestudio.planner.algorithms.pipedream.dp import Level, StateCosts


class ChainReach:
    """``may_finish(lv, row, col, m, limit)``: False only when A_lv[row][col][m] > limit.

    ``levels`` and the per-level ``below`` (M_l), ``width`` (W_l) and ``shortfall`` (E_l) are
    those of the DP; ``relative_slack`` and ``abs_slack_s`` / ``abs_slack_bytes`` widen every
    comparison by more than its rounding.
    """

    def __init__(
        self,
        costs: "StateCosts",
        levels: Sequence["Level"],
        *,
        memory_bytes: float,
        single_replica: bool,
        below: Sequence[int],
        width: Sequence[int],
        shortfall: Sequence[float],
        relative_slack: float,
        abs_slack_s: float,
        abs_slack_bytes: float,
    ) -> None:
        # Index 0 is the empty start (row 0), index s+1 is state s.
        self.compute_s = [0.0, *costs.compute_s]
        self.parameter_bytes = [0.0, *costs.parameter_bytes]
        self.held_bytes = [
            0.0,
            *(
                act + par
                for act, par in zip(costs.activation_bytes, costs.parameter_bytes, strict=True)
            ),
        ]
        self.levels, self.memory_bytes, self.single_replica = levels, memory_bytes, single_replica
        self.below, self.width, self.shortfall = below, width, shortfall
        self.slack, self.abs_slack_s, self.abs_slack_bytes = (
            relative_slack,
            abs_slack_s,
            abs_slack_bytes,
        )
        self.run_start = self._run_starts()
        self._time_keys: dict[tuple[int, int, int], list[float]] = {}

    def _run_starts(self) -> list[int]:
        """run_start[x]: the first index of the run ending at x along which nothing drops."""
        comp, par, held = self.compute_s, self.parameter_bytes, self.held_bytes
        starts = [0]
        for idx in range(1, len(comp)):
            rises = (
                comp[idx - 1] <= comp[idx]
                and par[idx - 1] <= par[idx]
                and held[idx - 1] <= held[idx]
            )
            starts.append(starts[idx - 1] if rises else idx)
        return starts

    def applies(self, row: int, col: int) -> bool:
        """Whether states row-1..col (the empty start for row 0) form such a run."""
        return self.run_start[col + 1] <= row

    def may_finish(self, lv: int, row: int, col: int, m: int, limit: float) -> bool:
        """reach[m+1] >= col (indices shifted by one: ``row`` is the start, col + 1 the end)."""
        end, reach = col + 1, [row]
        for used in range(1, m + 2):
            most = row
            if used == 1 or not self.single_replica:
                most = max(most, self._farthest(lv, row, end, used, used, limit, first=True))
            for replicas in range(1, 2 if self.single_replica else used):
                start = reach[used - replicas]
                most = max(most, start, self._farthest(lv, start, end, used, replicas, limit))
            if most >= end:
                return True
            reach.append(most)
        return False

    def _farthest(
        self,
        lv: int,
        start: int,
        end: int,
        used: int,
        replicas: int,
        limit: float,
        *,
        first: bool = False,
    ) -> int:
        """The last index a stage from ``start`` on ``replicas`` ending at machine ``used``
        might reach (``start`` when none)."""
        last = end
        stash = math.ceil((self.levels[lv].num_machines - used) / replicas)
        if stash:
            room = self.memory_bytes / stash
            room += room * self.slack + self.abs_slack_bytes
            held = self.held_bytes
            last = bisect.bisect_right(held, held[start] + room, start + 1, end + 1) - 1
        key = self._time_key(lv, replicas, self.width[lv] if first else 1)
        below_s = self.shortfall[lv - 1] / self.below[lv] if lv else 0.0
        reach_s = below_s + replicas * (limit + self.abs_slack_s)
        threshold = (
            key[start] + reach_s + self.abs_slack_s + self.slack * (abs(key[end]) + abs(reach_s))
        )
        return min(last, bisect.bisect_right(key, threshold, start + 1, end + 1) - 1)

    def _time_key(self, lv: int, replicas: int, width: int) -> list[float]:
        """C / M_l + all-reduce per byte * P: the stage bound's numerator, non-decreasing."""
        key = (lv, replicas, width)
        cached = self._time_keys.get(key)
        if cached is None:
            bandwidth = self.levels[lv].bandwidth_bytes_per_s
            per_byte = 4 * (replicas - 1) / (bandwidth * replicas) / width
            below = self.below[lv]
            cached = [
                comp / below + per_byte * par
                for comp, par in zip(self.compute_s, self.parameter_bytes, strict=True)
            ]
            self._time_keys[key] = cached
        return cached
