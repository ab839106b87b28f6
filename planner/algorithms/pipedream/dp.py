"""PipeDream's hierarchical dynamic program, evaluated exactly and fast.

This is the recurrence of PipeDream's optimizer (SOSP'19 §3.1, as coded in msr-fiddle/pipedream
@ 11c40c0 ``optimizer/optimizer_graph_hierarchical.py``, ``compute_partitioning``), over the
antichain states s_0..s_{n-1} of ``antichains.py``. For level l (innermost first) with N
machines of bandwidth B, W machines per machine below (1 at level 1), and row i meaning "start
after state i-1" (row 0: from the beginning), A_l[i][j][m] is the best time per minibatch of
states i..j on m+1 machines:

    base   = (T[i][j] + 4 m P[i][j] / (B (m+1)) / W) / (m+1)          one stage, m+1 replicas
    A[i][j][m] = min(base, min over k in anc(j), k >= i, m' in 1..m of
                 max(A[i][k][m-m'], (T[k+1][j] + 4 (m'-1) P[k+1][j] / (B m')) / m',
                     2 out(s_k) / (B m') / acr, 2 out(s_j) / (B m') / acr  [if j < n-1]))

T is the compute time at level 1 (C(s_j) - C(s_{i-1}), seconds) and A_{l-1}[i][j][N_{l-1}-1]
above; P, out and the activations of the memory check are byte sums. With a memory size, a
stage whose stash ceil(machines after it / its replicas) * (activations + parameters) exceeds
it is skipped. ``single_replica`` allows one replica per stage only (PipeDream's straight
pipeline); ``activation_compression_ratio`` None leaves the communication terms out, as
PipeDream does by default. The answer is A_L[0][n-1][N_L-1]. Every term is computed with
the same floating-point operations as the optimizer, so the optimum agrees to the last bits
of its (set-ordered) compute sums.

Like the optimizer, the levels below the top evaluate every row i, and row i >= 1 also admits a
first stage from s_{i-1} to an s_k that is not its descendant (an "irregular" stage: its cost
is the plain difference C(s_k) - C(s_{i-1}), not that of any set of layers, and can be
negative). That quirk can change the optimum, so we keep it.

Speed. The optimizer fills every table entry: O(n^3 N^2) for an inner level (197 s for
ResNet-50 on 8x2 machines). We evaluate top-down, from A_L[0][n-1][N_L-1], with memoised
branch and bound: an entry is asked for with a cutoff and is computed exactly only when its
value can be at most the cutoff; a candidate (k, m') is skipped when a lower bound
(``bounds.py``) shows it cannot beat the best so far. For each m' the ancestors k of
s_j are scanned in order of C(s_k) (``order.py``), from the point where the prefix
and stage bounds cross outwards, in increasing order of their bounds; a side stops once its
bound reaches the best value so far or no state left on it can fit the memory; a candidate
whose prefix cannot fit the memory, or is already known not to be faster, is passed over, and
an entry that ``reach.py`` shows cannot finish within its cutoff is not searched.
Skipped candidates are exactly those that could not have become the best, so the result is
the same minimum and the same split: the one-stage plan if no candidate is strictly faster,
else the first candidate, in this order, that attains it. Only ties between equally fast
plans may be broken differently from the optimizer (which breaks them by the memory addresses
of its objects).
"""

import bisect
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pipestudio.planner.algorithms.pipedream.bounds import SearchBounds, loosen
from pipestudio.planner.algorithms.pipedream.order import AncestorOrders

INF = math.inf

Split = tuple[int, int, int]  # (k, m - m', m'): the last stage is states k+1..j on m' replicas


@dataclass(frozen=True)
class Level:
    """One level of machines, innermost first; an infinite bandwidth is a free link."""

    num_machines: int
    bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class StateCosts:
    """Per antichain state: sums over its down-set, and its boundary's activation bytes."""

    compute_s: Sequence[float]
    activation_bytes: Sequence[float]
    parameter_bytes: Sequence[float]
    boundary_bytes: Sequence[float]
    ancestors: Sequence[int]


@dataclass(frozen=True)
class StageSpan:
    """States [start, end) of one stage, and its replicas at each level (innermost first)."""

    start: int
    end: int
    replicas: tuple[int, ...]


class HierarchicalDP:
    """PipeDream's DP for one set of state costs and levels (see the module docstring)."""

    def __init__(
        self,
        costs: StateCosts,
        levels: Sequence[Level],
        *,
        memory_bytes: float | None = None,
        single_replica: bool = False,
        activation_compression_ratio: float | None = 1.0,
    ) -> None:
        self.costs = costs
        self.levels = list(levels)
        self.memory_bytes = memory_bytes
        self.single_replica = single_replica
        self.ratio = activation_compression_ratio
        self.num_states = len(costs.compute_s)
        self.evaluations = 0
        self._exact: dict[tuple[int, int, int, int], tuple[float, Split | None]] = {}
        self._above: dict[tuple[int, int, int, int], float] = {}
        self._orders = AncestorOrders(
            costs.compute_s, costs.activation_bytes, costs.parameter_bytes, costs.ancestors
        )
        self.bounds = SearchBounds(
            costs, self.levels, memory_bytes=memory_bytes, single_replica=single_replica
        )

    def optimum_s(self) -> float | None:
        """A_L[0][n-1][N_L-1] in seconds per minibatch; None when no plan is allowed."""
        top = len(self.levels) - 1
        # Each replica taken off recurses about four calls deeper.
        depth, limit = 8 * sum(level.num_machines for level in self.levels) + 200, 0
        if depth > sys.getrecursionlimit():
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(depth)
        try:
            value = self.entry(top, 0, self.num_states - 1, self.levels[top].num_machines - 1, INF)
        finally:
            if limit:
                sys.setrecursionlimit(limit)
        return None if value == INF else value

    def entry(self, lv: int, row: int, col: int, m: int, cutoff: float) -> float:
        """A_lv[row][col][m] if it is at most ``cutoff``, else some value above the cutoff."""
        key = (lv, row, col, m)
        known = self._exact.get(key)
        if known is not None:
            return known[0]
        above = self._above.get(key)
        if above is not None and cutoff <= above:
            return INF
        self.evaluations += 1
        if self.bounds.may_finish(lv, row, col, m, cutoff):
            value, split = self._solve(lv, row, col, m, cutoff)
        else:
            value, split = INF, None
        if value <= cutoff:
            self._exact[key] = (value, split)
            return value
        self._above[key] = cutoff if above is None else max(above, cutoff)
        return INF

    def _solve(
        self, lv: int, row: int, col: int, m: int, cutoff: float
    ) -> tuple[float, Split | None]:
        best = self._base(lv, row, col, m, cutoff)
        split: Split | None = None
        if m == 0 or col == row:
            return best, split
        for replicas in range(1, 2 if self.single_replica else m + 1):
            best, split = self._scan(lv, row, col, m, replicas, best, split, cutoff)
        return best, split

    def _base(self, lv: int, row: int, col: int, m: int, cutoff: float) -> float:
        """One stage of states row..col on m+1 replicas (``compute_partitioning``'s first loop)."""
        if self.single_replica and m > 0:
            return INF
        act, par = self.costs.activation_bytes, self.costs.parameter_bytes
        cum_act = act[col] - act[row - 1] if row > 0 else act[col]
        cum_par = par[col] - par[row - 1] if row > 0 else par[col]
        level = self.levels[lv]
        machines = level.num_machines
        if self.memory_bytes is not None and (
            math.ceil((machines - (m + 1)) / (m + 1)) * (cum_act + cum_par) > self.memory_bytes
        ):
            return INF
        compute = self._segment_time(lv, row, col, loosen(cutoff * (m + 1)))
        if compute == INF:
            return INF
        all_reduce = (4 * m * cum_par) / (level.bandwidth_bytes_per_s * (m + 1))
        all_reduce /= self.bounds.width[lv]
        return (compute + all_reduce) / (m + 1)

    def _segment_time(self, lv: int, row: int, col: int, cutoff: float) -> float:
        """T_lv[row][col]: compute time at level 1, the level below's optimum above it."""
        if lv == 0:
            compute = self.costs.compute_s
            return compute[col] - compute[row - 1] if row > 0 else compute[col]
        below = self.levels[lv - 1].num_machines
        return self.entry(lv - 1, row, col, below - 1, cutoff)

    def _scan(
        self,
        lv: int,
        row: int,
        col: int,
        m: int,
        replicas: int,
        best: float,
        split: Split | None,
        cutoff: float,
    ) -> tuple[float, Split | None]:
        """Best (k, replicas) split of A_lv[row][col][m], outwards from the bounds' crossing."""
        order = self._orders.of(col)
        states, comp, count = order.states, order.compute_s, order.size
        prefix = m - replicas + 1  # machines left for states row..k
        stage_bound = self.bounds.stage(lv, col, m, replicas, order)
        prefix_bound = self.bounds.prefix(lv, row, prefix, order)
        room = self.bounds.prefix_room(lv, row, prefix)
        act, par = self.costs.activation_bytes, self.costs.parameter_bytes
        hi = bisect.bisect_left(
            comp, self.bounds.crossing(lv, row, col, prefix, replicas), 0, count
        )
        lo = hi - 1
        while True:
            if hi < count:
                bound_hi = prefix_bound(hi)
                if bound_hi >= best or bound_hi > cutoff:
                    hi = count
            if lo >= 0:
                bound_lo = stage_bound(lo, min(best, cutoff))
                if bound_lo == INF:
                    lo = -1
            if hi < count and (lo < 0 or bound_hi <= bound_lo):
                k, hi = states[hi], hi + 1
            elif lo >= 0:
                k, lo = states[lo], lo - 1
            else:
                return best, split
            if k >= row and act[k] + par[k] <= room:
                value = self._candidate(lv, row, col, m, k, replicas, best, cutoff)
                if value < best:
                    best, split = value, (k, m - replicas, replicas)

    def _candidate(
        self, lv: int, row: int, col: int, m: int, k: int, replicas: int, best: float, cutoff: float
    ) -> float:
        """max(A[row][k][m-replicas], last stage k+1..col) or INF when it cannot win."""
        limit = min(best, cutoff)
        if self._known_not_below(lv, row, k, m - replicas, best, limit):
            return INF
        stage = self._last_stage(lv, k, col, m, replicas, limit)
        if stage >= best or stage > cutoff:
            return INF
        prefix = self.entry(lv, row, k, m - replicas, limit)
        if prefix == INF:
            return INF
        return max(prefix, stage)

    def _known_not_below(
        self, lv: int, row: int, col: int, m: int, best: float, limit: float
    ) -> bool:
        """Whether the memo already shows A_lv[row][col][m] cannot be below ``best``."""
        key = (lv, row, col, m)
        known = self._exact.get(key)
        if known is not None:
            return known[0] >= best
        return self._above.get(key, -INF) >= limit

    def _last_stage(self, lv: int, k: int, col: int, m: int, replicas: int, limit: float) -> float:
        """Time of stage k+1..col on ``replicas`` replicas, communication included."""
        costs, level = self.costs, self.levels[lv]
        bandwidth = level.bandwidth_bytes_per_s
        cum_act = costs.activation_bytes[col] - costs.activation_bytes[k]
        cum_par = costs.parameter_bytes[col] - costs.parameter_bytes[k]
        if self.memory_bytes is not None and (
            (cum_act + cum_par) * math.ceil((level.num_machines - (m + 1)) / replicas)
            > self.memory_bytes
        ):
            return INF
        comm = -INF
        if self.ratio is not None:
            comm = (2.0 * costs.boundary_bytes[k]) / (bandwidth * replicas) / self.ratio
            if col < self.num_states - 1:
                out = (2.0 * costs.boundary_bytes[col]) / (bandwidth * replicas) / self.ratio
                comm = max(comm, out)
            if comm > limit:
                return INF
        compute = self._segment_time(lv, k + 1, col, loosen(limit * replicas))
        if compute == INF:
            return INF
        last = (compute + (4 * (replicas - 1) * cum_par) / (bandwidth * replicas)) / replicas
        return max(last, comm)

    def stages(self) -> list[StageSpan]:
        """The optimum's stages in pipeline order (``analyze_partitioning``, top level down)."""
        spans = [StageSpan(0, self.num_states, ())]
        for lv in reversed(range(len(self.levels))):
            spans = [
                StageSpan(start, end, (replicas, *span.replicas))
                for span in spans
                for start, end, replicas in self._splits(lv, span.start, span.end)
            ]
        return spans

    def level_splits(self) -> list[list[tuple[int, int, int]]]:
        """Per level (innermost first): its stages as (start, end, replicas at that level)."""
        result: list[list[tuple[int, int, int]]] = []
        segments = [(0, self.num_states)]
        for lv in reversed(range(len(self.levels))):
            splits = [split for start, end in segments for split in self._splits(lv, start, end)]
            result.insert(0, splits)
            segments = [(start, end) for start, end, _ in splits]
        return result

    def _splits(self, lv: int, start: int, end: int) -> list[tuple[int, int, int]]:
        m, col = self.levels[lv].num_machines - 1, end - 1
        result = []
        while True:
            value, split = self._exact[(lv, start, col, m)]
            assert value != INF, "stages() needs a feasible optimum"
            if split is None:
                result.append((start, col + 1, m + 1))
                return result[::-1]
            k, m, replicas = split
            result.append((k + 1, col + 1, replicas))
            col = k
