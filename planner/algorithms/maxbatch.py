"""The largest micro-batch size for which a planner finds a plan that fits device memory.

DawnPiper (Peng et al. 2025, §6) measures a planner's memory efficiency by the largest batch
it can train on given devices: the better it balances memory across stages and the better
its recompute/swap choices, the more samples fit. Here that is the largest micro-batch size
N such that the planner, asked for the request at N samples per micro-batch (the profile
rescaled linearly, ``Profile.rescaled``), returns a plan whose simulation fits
(``SimResult.fits``); the global batch is N x the micro-batches per step.

The search assumes fitting is monotone in N (more samples never need less memory): from the
request's micro-batch size (the profile's by default) it doubles while plans fit, or halves
while they do not, then bisects between the largest size seen to fit and the smallest seen
to fail. It costs about 2 log2(N / start) planner calls and simulations. Whatever happens to
monotonicity, the answer is verified: N was seen to fit and N + 1 to fail, unless N is the
search's upper limit (``limit_reached``). Without a memory limit every size fits, so the
question needs one.
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipestudio.planner.algorithms.min_memory import (
    Attempt,
    attempt,
    search_min_memory,
    smallest_device_memory,
)
from pipestudio.planner.algorithms.request import Planner, PlanRequest
from pipestudio.planner.errors import InfeasibleError, PlannerError
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.result import SimResult
from pipestudio.planner.simulator.simulate import simulate
from pipestudio.planner.units import format_bytes

#: Default upper limit of the search, in samples per micro-batch.
MAX_MICROBATCH_SIZE = 1 << 16


@dataclass(frozen=True)
class BatchTry:
    """One size the search tried (the trace)."""

    microbatch_size: int
    fits: bool
    peak_bytes: int | None
    planner_ms: float
    error: str | None


@dataclass(frozen=True)
class MaxBatch:
    """The answer: the size, its plan and simulation, and how the search got there."""

    microbatch_size: int
    num_microbatches: int
    plan: Plan
    result: SimResult
    limit_reached: bool
    trace: list[BatchTry]
    search_ms: float

    @property
    def global_batch(self) -> int:
        return self.microbatch_size * self.num_microbatches

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "microbatch_size": self.microbatch_size,
            "global_batch": self.global_batch,
            "plan": self.plan.model_dump(mode="json"),
            "result": self.result.model_dump(mode="json"),
            "limit_reached": self.limit_reached,
            "search_ms": self.search_ms,
            "trace": [dataclasses.asdict(entry) for entry in self.trace],
        }


def max_microbatch_size(
    planner: Planner,
    request: PlanRequest,
    *,
    limit: int = MAX_MICROBATCH_SIZE,
    with_timeline: bool = False,
) -> MaxBatch:
    """The largest micro-batch size up to ``limit`` that fits (see the module docstring)."""
    if smallest_device_memory(request.cluster) is None:
        raise PlannerError(
            "max-batch needs a device memory: --device-memory or a cluster with memory_bytes"
        )
    if limit < 1:
        raise PlannerError(f"the micro-batch size limit must be >= 1, got {limit}")
    started = time.perf_counter()
    tried: dict[int, Attempt] = {}

    def fits(size: int) -> bool:
        if size not in tried:
            tried[size] = attempt(planner, dataclasses.replace(request, microbatch_size=size))
        return tried[size].fits

    low, high = _bracket(fits, min(limit, request.scaled.microbatch_size), limit)
    if low == 0:
        raise _nothing_fits(planner, request, tried[1])
    while high is not None and high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    assert tried[low].fits and (high is None or not tried[low + 1].fits)
    best = tried[low]
    assert best.output is not None and best.result is not None
    result = best.result
    if with_timeline:
        result = simulate(request.profile.rescaled(low), best.output.plan, request.cluster)
    trace = [
        BatchTry(
            size,
            entry.fits,
            entry.peak_bytes,
            entry.planner_ms,
            None if entry.error is None else str(entry.error),
        )
        for size, entry in tried.items()
    ]
    return MaxBatch(
        low,
        request.num_microbatches,
        best.output.plan,
        result,
        high is None,
        trace,
        (time.perf_counter() - started) * 1e3,
    )


def _bracket(fits: Callable[[int], bool], start: int, limit: int) -> tuple[int, int | None]:
    """(a size that fits or 0, a larger one that does not or None at the limit)."""
    if fits(start):
        low = start
        while low < limit:
            size = min(2 * low, limit)
            if not fits(size):
                return low, size
            low = size
        return low, None
    high = start
    while high > 1:
        size = high // 2
        if fits(size):
            return size, high
        high = size
    return 0, 1


def _nothing_fits(planner: Planner, request: PlanRequest, one: Attempt) -> PlannerError:
    """Not even one sample per micro-batch fits: say what memory would hold one (or, when
    the planner refused for another reason, that reason)."""
    given = smallest_device_memory(request.cluster)
    assert given is not None
    if one.error is not None and not isinstance(one.error, InfeasibleError):
        return one.error
    if one.error is not None:
        reason = str(one.error)
    else:
        reason = f"its plan needs {format_bytes(one.peak_bytes or 0)} on its fullest device"
    message = f"not even a micro-batch of 1 sample fits {format_bytes(given)} per device ({reason})"
    search = search_min_memory(
        planner, dataclasses.replace(request, microbatch_size=1), infeasible_bytes=given
    )
    if search.min_memory_bytes is None:
        return InfeasibleError(f"{message}; no device memory is enough: {search.failure}")
    return InfeasibleError(
        f"{message}; the smallest device memory that fits it is {search.describe()}",
        search.min_memory_bytes,
        search.precision_bytes,
    )
