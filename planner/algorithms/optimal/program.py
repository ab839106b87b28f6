"""The ``optimal`` planner's dynamic program over devices used and chain prefixes.

best(d, j) is the smallest bottleneck of layers 0..j-1 on devices 0..d-1 (``planner.py``
states the recurrence and why its pruning is valid). ``Program.run`` fills it for one way of
valuing a stage: the chosen value (``gallop`` on) or a proven lower bound of it.
"""

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.cost_model.chain import ChainCosts, StageEvaluator
from pipestudio.planner.cost_model.stage import StageContext, stage_context

if TYPE_CHECKING:  # optimal_band.py imports this module
    from pipestudio.planner.algorithms.optimal.band import Band

#: Stages with at most this many layers get the exact subproblem (3^12 policy choices).
EXACT_MAX_LAYERS = 12

# stage(i, j, c, head, current) -> its value in context c, or anything >= current when it
# cannot win
StageValue = Callable[[int, int, int, float, float], float]
# best(d, j) and its back-pointers (start, replicas)
Table = tuple[list[list[float]], list[list[tuple[int, int]]]]


@dataclass(frozen=True)
class DeviceLayout:
    """The stage shapes a plan on ``num_devices`` devices may use: replica counts, and the
    context of a stage by its first device and replicas (an index into ``contexts``)."""

    num_devices: int
    replica_counts: tuple[int, ...]
    contexts: list[StageContext]
    context_index: dict[tuple[int, int], int]
    min_stages: tuple[int, ...]  # fewest stages that use exactly d devices

    @classmethod
    def of(cls, request: PlanRequest, num_devices: int) -> "DeviceLayout":
        m = request.num_microbatches
        counts = (
            (1,)
            if request.single_replica
            else tuple(r for r in range(1, num_devices + 1) if m % r == 0)
        )
        contexts: list[StageContext] = []
        index: dict[tuple[int, int], int] = {}
        for first in range(num_devices):
            for r in counts:
                if first + r <= num_devices:
                    index[(first, r)] = len(contexts)
                    contexts.append(
                        stage_context(
                            request.schedule,
                            m,
                            request.optimizer,
                            request.cluster,
                            first_worker=first,
                            replicas=r,
                            num_workers=num_devices,
                        )
                    )
        fewest = [0]
        for d in range(1, num_devices + 1):
            fewest.append(1 + min(fewest[d - r] for r in counts if r <= d))
        return cls(num_devices, counts, contexts, index, tuple(fewest))

    def context(self, first_device: int, replicas: int) -> int:
        return self.context_index[(first_device, replicas)]


class Program:
    """best(d, j) and its back-pointers (start, replicas) for one way of valuing stages."""

    def __init__(
        self,
        chain: ChainCosts,
        stages: StageEvaluator,
        links: list[list[float]],
        layout: DeviceLayout,
        band: "Band",
    ) -> None:
        self.chain, self.stages, self.links, self.layout = chain, stages, links, layout
        self.band = band
        self.base = [f + b for f, b in zip(chain.fwd, chain.bwd, strict=True)]  # prefix sums
        #: Whether a gallop skipped starts on its assumption: then the answer is not proven.
        self.assumed = False

    def ends(self, d: int, limit: float) -> range:
        """The ends j of a prefix on d devices that can be part of a plan within ``limit``:
        a stage on r devices computes at most r x limit, so the prefix at most d x limit and
        the rest at most (D - d) x limit; each stage takes a layer; and the memory band
        (``optimal_band``) holds j."""
        base, layout, band = self.base, self.layout, self.band
        count, rest = len(base) - 1, layout.num_devices - d
        after = rest * limit if rest else 0.0  # inf x 0 would be nan
        first = max(layout.min_stages[d], bisect.bisect_left(base, base[count] - after), band.lo[d])
        last = min(
            count - layout.min_stages[rest], bisect.bisect_right(base, d * limit) - 1, band.hi[d]
        )
        return range(first, last + 1)

    def run(self, upper: float, stage_value: StageValue, *, gallop: bool) -> Table:
        """best(d, j) within ``upper`` (inf beyond it) and its (start, replicas).

        ``gallop`` lets the scan of starts assume, for stages of more than
        ``EXACT_MAX_LAYERS`` layers, that a stage is no faster with more layers: see
        ``_Scan.gallop``.
        """
        count, layout = len(self.base) - 1, self.layout
        num_devices = layout.num_devices
        limit = upper * (1 + 1e-12)
        best = [[math.inf] * (count + 1) for _ in range(num_devices + 1)]
        back = [[(-1, 0)] * (count + 1) for _ in range(num_devices + 1)]
        best[0][0] = 0.0
        reach = [(0, 0)]  # per d: the first and last j with a finite best(d, j)
        for d in range(1, num_devices + 1):
            row, row_back = best[d], back[d]
            for j in self.ends(d, limit):
                current, found = limit, (-1, 0)
                for r in layout.replica_counts:
                    if r > d:
                        break
                    lowest, highest = reach[d - r]
                    scan = _Scan(self, stage_value, best[d - r], d - r, r, j, current)
                    lowest = max(lowest, self.band.first_start(scan.c, j))
                    scan.search(lowest, min(highest, j - 1), gallop=gallop)
                    if scan.start >= 0:
                        current, found = scan.current, (scan.start, r)
                if found[0] >= 0:
                    row[j], row_back[j] = current, found
            finite = [j for j in range(count + 1) if row[j] < math.inf]
            reach.append((finite[0], finite[-1]) if finite else (count + 1, -1))
        return best, back


class _Scan:
    """The starts i of a stage that ends at layer j and has ``replicas`` replicas from
    device ``first``, best first found."""

    def __init__(
        self,
        program: Program,
        stage_value: StageValue,
        previous: list[float],
        first: int,
        replicas: int,
        j: int,
        limit: float,
    ) -> None:
        self.program, self.stages, self.stage_value = program, program.stages, stage_value
        self.previous, self.link = previous, program.links[first]
        self.c = program.layout.context(first, replicas)
        self.replicas, self.j = replicas, j
        self.current, self.start = limit, -1

    def search(self, lowest: int, highest: int, *, gallop: bool) -> None:
        """Starts highest, ..., lowest: those of at most ``EXACT_MAX_LAYERS`` layers first
        without ``gallop``, the larger ones first with it (their best prunes the rest)."""
        if lowest > highest:
            return
        small = max(lowest, self.j - EXACT_MAX_LAYERS)
        if small > highest:  # every start gives a large stage
            if gallop:
                self.gallop(highest, lowest)
            else:
                self.run(highest, lowest)
        elif gallop and small > lowest:
            self.gallop(small - 1, lowest)
            self.run(highest, small)
        elif self.run(highest, small) and small > lowest:
            self.run(small - 1, lowest)

    def head(self, i: int) -> float:
        return max(self.previous[i], self.link[i])

    def run(self, high: int, low: int, *, monotone: bool = False) -> bool:
        """Try starts high, high - 1, ..., low; False once no earlier start can win.
        ``monotone``: assume the stage only gets slower with earlier starts."""
        least, j, c = self.stages.least_ms, self.j, self.c
        for i in range(high, low - 1, -1):
            if least(i, j, c) >= self.current:
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
        low, settled = self.stages.bounds(i, self.j, self.c)
        if low >= self.current:
            return not monotone and low != math.inf
        if not settled:
            low = self.stage_value(i, self.j, self.c, head, self.current)
            if monotone and low >= self.current:
                return False
        value = head if head > low else low
        if value < self.current:
            self.current, self.start = value, i
        return True

    def gallop(self, high: int, lowest: int) -> None:
        """Starts high, high - 1, ..., lowest of stages too large for the exact subproblem.

        Assuming a stage gets no faster as it takes more layers, the starts where the stage
        is within the previous stages' best, fits(i), come last (near j) and the best of them
        is the earliest, i0, found by binary search: before it only i0's head counts, after
        it the stage grows, so the plain scan resumes at i0 - 1. The program on lower bounds
        makes no such assumption, so the proven gap holds whatever the stages do.
        """
        j, c = self.j, self.c
        low = (
            bisect.bisect_right(
                range(lowest, high + 1), -self.current, key=lambda i: -self.stages.least_ms(i, j, c)
            )
            + lowest
        )
        if low > high:
            return
        self.program.assumed = True

        def fits(i: int) -> bool:
            within = self.previous[i]
            if within == math.inf:
                return True
            low, settled = self.stages.bounds(i, j, c)
            if settled or low > within:
                return low <= within
            return self.stage_value(i, j, c, within, within) <= within

        if not fits(high):
            self.run(high, lowest, monotone=True)
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
        self.run(high - 1, lowest, monotone=True)
