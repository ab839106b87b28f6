"""The prefixes of a chain that a plan's devices can hold at all: ``optimal``'s memory band.

No keep/recompute/swap choice takes a stage below its floor (``StageEvaluator.floor_bytes``:
static bytes, workspace and every layer's saved bytes once), and the floor grows with every
layer the stage takes; a stage whose floor exceeds its device memory cannot fit
(``StageEvaluator.compute_bounds`` values it inf). Relaxing every stage to its floor gives,
after one pass over the chain per kind of context (two pointers):

- ``first_start(s, j)``: the earliest start of a stage ending at j in context s whose floor
  fits; earlier starts only add to it;
- ``hi[d]`` >= every j such that layers 0..j-1 fit on devices 0..d-1: hi[0] = 0 and hi[d]
  is the furthest end of a stage in context (d - r, r) that starts at hi[d - r], over r.
  By induction: the last stage (i, j) of such a prefix starts at i <= hi[d - r], and the
  stage from hi[d - r] to j (if j is beyond it) has a floor no larger than (i, j)'s;
- ``lo[d]`` <= every j such that layers j..n-1 fit on devices d..D-1, the same way from the
  end: lo[D] = n and lo[d] is the least first_start of a stage in context (d, r) that ends
  at lo[d + r].

So hi[D] < n proves that no plan fits, in O(n) rather than a program over every stage; and
best(d, j) can be finite only for lo[d] <= j <= hi[d], which narrows the program's rows
where memory is tight.
"""

import bisect
from dataclasses import dataclass

from pipestudio.planner.algorithms.optimal.program import DeviceLayout
from pipestudio.planner.cost_model.chain import StageEvaluator


@dataclass(frozen=True)
class Band:
    """lo[d] <= j <= hi[d] for every prefix j that devices 0..d-1 can hold (module
    docstring), and the earliest start of a stage that may fit, by context and end."""

    lo: list[int]
    hi: list[int]
    starts: list[list[int]]  # starts[s][j] = first_start(s, j)

    @classmethod
    def of(cls, stages: StageEvaluator, layout: DeviceLayout) -> "Band":
        count = stages.chain.num_layers
        shared: dict[tuple[object, ...], list[int]] = {}
        starts = []
        for s, ctx in enumerate(stages.contexts):
            key = (ctx.optimizer_factor, ctx.weight_versions, ctx.memory_bytes)
            if key not in shared:
                shared[key] = _first_starts(stages, s)
            starts.append(shared[key])
        hi = [0]
        for d in range(1, layout.num_devices + 1):
            hi.append(
                max(
                    bisect.bisect_right(starts[layout.context(d - r, r)], hi[d - r]) - 1
                    for r in layout.replica_counts
                    if r <= d
                )
            )
        lo = [count] * (layout.num_devices + 1)
        for d in range(layout.num_devices - 1, -1, -1):
            lo[d] = min(
                starts[layout.context(d, r)][lo[d + r]]
                for r in layout.replica_counts
                if d + r <= layout.num_devices
            )
        return cls(lo, hi, starts)

    @property
    def feasible(self) -> bool:
        """False when no plan fits, proven by the floors alone; True says only that the
        floors leave room."""
        return self.hi[-1] >= len(self.starts[0]) - 1 and self.lo[0] <= 0

    def first_start(self, s: int, j: int) -> int:
        return self.starts[s][j]


def _first_starts(stages: StageEvaluator, s: int) -> list[int]:
    """first_start(s, j) for every j, by two pointers: it never decreases as j grows."""
    count = stages.chain.num_layers
    memory = stages.contexts[s].memory_bytes
    if memory is None:
        return [0] * (count + 1)
    result, i = [0] * (count + 1), 0
    for j in range(1, count + 1):
        while i < j and stages.floor_bytes(i, j, s) > memory:
            i += 1
        result[j] = i
    return result
