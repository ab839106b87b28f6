"""The smallest memory per device at which a planner's plan fits, found by bisection.

When a planner finds no plan that fits device memory, the useful answer is how much memory
would be enough: it tells a person whether to take bigger devices, more stages or smaller
micro-batches. Each planner has its own model of memory and its own ways of saving it
(recompute, swap, repartition), so the answer is found with the planner itself: memory M is
*feasible* when the planner, asked again with every device of the cluster set to M bytes,
returns a plan whose simulation fits (``SimResult.fits``).

The search (``search_min_memory``):

1. ask with unlimited memory; if the planner fails even then, no memory is enough and the
   answer says why. Otherwise its plan's largest stage peak is the first guess;
2. double the guess until it is feasible (planners that model memory differently from the
   simulator may need more than that peak);
3. bisect between the largest memory seen to fail and the smallest seen to fit, until they
   are within ``MEMORY_PRECISION`` of the latter, or the search has run for ``budget_s``
   (a planner can take seconds per call on thousands of layers when memory is tight); the
   answer is the feasible end, and its precision the distance to the infeasible one.

Bisection assumes feasibility is monotone in M (more memory never hurts a planner). Where a
heuristic breaks that, the answer is still a memory at which the plan was seen to fit, with
one at most ``precision_bytes`` below it seen to fail. Each step costs one planner call and
one simulation; about log2(1 / MEMORY_PRECISION) + log2(first guess / given memory) steps.
"""

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipestudio.planner.errors import InfeasibleError, PlannerError
from pipestudio.planner.formats.cluster import Cluster, cluster_template
from pipestudio.planner.formats.result import SimResult
from pipestudio.planner.simulator.simulate import simulate
from pipestudio.planner.units import format_bytes

if TYPE_CHECKING:  # request.py imports this module
    from pipestudio.planner.algorithms.request import Planner, PlannerOutput, PlanRequest

#: The search stops when the feasible and infeasible ends are this close, relative to the
#: feasible end (0.1%: 2 MiB on a 2 GiB device).
MEMORY_PRECISION = 1e-3
#: Doublings of the first guess tried before the search gives up (a factor of 65536).
MAX_DOUBLINGS = 16
#: Seconds after which the bisection stops and reports the precision it reached.
SEARCH_BUDGET_S = 10.0


@dataclass(frozen=True)
class Attempt:
    """The planner asked once: its plan and the plan's simulation, or its error."""

    output: "PlannerOutput | None"
    result: SimResult | None
    error: PlannerError | None
    planner_ms: float

    @property
    def fits(self) -> bool:
        return self.result is not None and self.result.fits

    @property
    def peak_bytes(self) -> int | None:
        """The largest device peak of the plan, None without a plan."""
        if self.result is None:
            return None
        return self.result.largest_peak_bytes


def attempt(planner: "Planner", request: "PlanRequest", *, with_timeline: bool = False) -> Attempt:
    """Ask ``planner`` and simulate its plan on the request's cluster."""
    started = time.perf_counter()
    try:
        output = planner(request)
    except PlannerError as exc:
        return Attempt(None, None, exc, (time.perf_counter() - started) * 1e3)
    elapsed_ms = (time.perf_counter() - started) * 1e3
    result = simulate(request.scaled, output.plan, request.cluster, with_timeline=with_timeline)
    return Attempt(output, result, None, elapsed_ms)


def smallest_device_memory(cluster: Cluster | None) -> int | None:
    """The least memory of the cluster's devices; None when every one is unlimited."""
    if cluster is None:
        return None
    memories = [d.memory_bytes for d in cluster.devices if d.memory_bytes is not None]
    return min(memories) if memories else None


def with_device_memory(request: "PlanRequest", memory_bytes: int | None) -> "PlanRequest | None":
    """The request with every device's memory set to ``memory_bytes`` (None: unlimited);
    None when the request has neither a cluster nor a stage count to make one."""
    if request.cluster is None:
        if request.num_stages is None:
            return None
        cluster = cluster_template(
            [request.num_stages], [None], device_memory_bytes=memory_bytes, name="memory-only"
        )
    else:
        devices = [
            device.model_copy(update={"memory_bytes": memory_bytes})
            for device in request.cluster.devices
        ]
        cluster = request.cluster.model_copy(update={"devices": devices})
    return dataclasses.replace(request, cluster=cluster)


def precision_bytes(memory_bytes: int) -> int:
    return max(1, int(memory_bytes * MEMORY_PRECISION))


@dataclass(frozen=True)
class MemorySearch:
    """What ``search_min_memory`` found: the memory, or why no memory is enough."""

    min_memory_bytes: int | None
    precision_bytes: int | None
    num_attempts: int
    failure: str | None = None
    stopped_early: bool = False

    def describe(self) -> str:
        """The memory for a message, e.g. ``2.37 GiB (2544867123 bytes)``."""
        assert self.min_memory_bytes is not None
        text = f"{format_bytes(self.min_memory_bytes)} ({self.min_memory_bytes} bytes)"
        if self.stopped_early:
            text += (
                f" (to within {format_bytes(self.precision_bytes or 0)}: the search "
                "ran out of time)"
            )
        return text


def search_min_memory(
    planner: "Planner",
    request: "PlanRequest",
    *,
    infeasible_bytes: int = 0,
    budget_s: float = SEARCH_BUDGET_S,
) -> MemorySearch:
    """The smallest memory per device at which ``planner`` answers ``request`` with a plan
    that fits (module docstring); ``infeasible_bytes`` is a memory already known to fail."""
    deadline = time.perf_counter() + budget_s
    unlimited = with_device_memory(request, None)
    if unlimited is None:
        return MemorySearch(None, None, 0, "the request names no devices")
    tried: dict[int, bool] = {}

    def feasible(memory_bytes: int) -> bool:
        if memory_bytes not in tried:
            capped = with_device_memory(request, memory_bytes)
            assert capped is not None
            tried[memory_bytes] = attempt(planner, capped).fits
        return tried[memory_bytes]

    first = attempt(planner, unlimited)
    if first.peak_bytes is None:
        return MemorySearch(None, None, 1, f"with unlimited memory it fails too: {first.error}")
    low, high = infeasible_bytes, max(first.peak_bytes, infeasible_bytes + 1)
    for _ in range(MAX_DOUBLINGS):
        if feasible(high):
            break
        low, high = high, 2 * high
    else:
        return MemorySearch(
            None, None, 1 + len(tried), f"no memory up to {format_bytes(low)} per device fits"
        )
    while high - low > precision_bytes(high):
        if time.perf_counter() > deadline:
            return MemorySearch(high, high - low, 1 + len(tried), stopped_early=True)
        middle = (low + high) // 2
        if feasible(middle):
            high = middle
        else:
            low = middle
    return MemorySearch(high, precision_bytes(high), 1 + len(tried))


def explain_infeasible(
    planner: "Planner", request: "PlanRequest", exc: InfeasibleError
) -> InfeasibleError:
    """``exc`` with the smallest memory that fits found and named in its message."""
    if exc.min_memory_bytes is not None:
        return exc
    given = smallest_device_memory(request.cluster)
    search = search_min_memory(planner, request, infeasible_bytes=given or 0)
    if search.min_memory_bytes is None:
        return InfeasibleError(f"{exc}; no device memory is enough: {search.failure}")
    against = "" if given is None else f", against {format_bytes(given)} given"
    return InfeasibleError(
        f"{exc}; the smallest device memory that fits is {search.describe()} per device{against}",
        search.min_memory_bytes,
        search.precision_bytes,
    )
