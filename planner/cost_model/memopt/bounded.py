"""Large stages' memory subproblem: a fast choice and a proven lower bound on the best one.

``memopt.solve_exact`` is exact but its Pareto sets grow quickly with the number of layers;
a stage of a 2,000-layer model has a hundred or more. For those, this module answers with a
choice and a certificate instead.

The lower bound relaxes two things: layers may be split (fractional) and recompute runs
keep no checkpoint. Given a stage time T, recompute then has R = T - F - B of forward time
and swap S = min(swap limit, g^-1(T)) bytes (``memopt`` module docstring). Per byte,
recompute frees k - 1 and swap k - c <= k - 1, and swap costs the same per byte whichever
layer it takes, so the relaxation's best use of T is to recompute the bytes cheapest to
recompute (largest saved bytes per forward ms) up to R, and swap up to S of the rest.
Memory freed so grows with T; the least T that frees enough is found by bisection. No
choice of whole layers does better, so the best stage time is at least that T.

The choice: for a target T, recompute layers in that same order while they fit in R (a
layer whose recompute frees nothing, because of its checkpoint, is skipped), then swap the
kept layers least worth recomputing while they fit in S; or swap first, then recompute.
Bisection finds the least T for which one of them frees enough (``floor`` and ``cutoff``
bound the search as in ``solve_exact``). The gap between the choice's time and the bound
is at most about one layer's forward or transfer time in practice; ``StageChoice.lower_ms``
carries the bound so a planner can report a proven gap.
"""

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

from pipestudio.planner.cost_model.memopt.exact import (
    KEEP,
    RECOMPUTE,
    SWAP,
    StageChoice,
    StageProblem,
)

#: The choice's search stops when its interval is this small relative to the time: finer
#: would not change a plan, and the lower bound (exact) keeps the certificate honest.
_TIME_TOLERANCE = 1e-4


@dataclass(frozen=True)
class _Ranked:
    """Layers from best to worst to recompute, with prefix sums in that order."""

    order: list[int]
    fwd_prefix: list[float]
    saved_prefix: list[int]
    input_prefix: list[int]

    @classmethod
    def of(cls, problem: StageProblem) -> "_Ranked":
        fwd, saved = problem.fwd_ms, problem.saved_bytes
        worth = problem.worth or tuple(
            size / ms if ms > 0 else math.inf for ms, size in zip(fwd, saved, strict=True)
        )
        order = sorted(range(len(fwd)), key=worth.__getitem__, reverse=True)
        return cls(
            order,
            [0.0, *accumulate(map(fwd.__getitem__, order))],
            [0, *accumulate(map(saved.__getitem__, order))],
            [0, *accumulate(map(problem.input_bytes.__getitem__, order))],
        )


def _swap_room(problem: StageProblem, time_ms: float) -> float:
    return max(0.0, min(problem.swap_limit_bytes, problem.max_swap_bytes(time_ms)))


def _bisect_time(feasible: Callable[[float], bool], low: float, high: float) -> float:
    """Bisection on [low, high] for where ``feasible(time)`` starts to hold (``high`` must
    hold), to ``_TIME_TOLERANCE``: the first time seen to hold."""
    while high - low > _TIME_TOLERANCE * high:
        middle = (low + high) / 2
        if feasible(middle):
            high = middle
        else:
            low = middle
    return high


def lower_bound_ms(problem: StageProblem, ranked: _Ranked | None = None) -> float:
    """A proven lower bound on the stage's best time; inf when nothing frees enough.

    The relaxation's freed bytes grow with T; the recompute budget crosses the ranked
    layers' forward times one by one, so a binary search over those breakpoints finds the
    layer at which enough is freed, and ``_segment_time`` the time inside its span.
    """
    if problem.need_bytes <= 0:
        return problem.base_ms
    k = problem.inflight
    ranked = ranked or _Ranked.of(problem)
    fwd_prefix, saved_prefix = ranked.fwd_prefix, ranked.saved_prefix
    total = saved_prefix[-1]
    need, base = problem.need_bytes, problem.base_ms
    if k <= 1 or (k - 1) * total < need:
        return math.inf
    swap_per_byte = max(0, k - problem.swap_buffers)

    pieces = _swap_room_pieces(problem)

    def freed(time_ms: float, recomputed: float) -> float:
        if not swap_per_byte:
            return (k - 1) * recomputed
        room = min(offset + slope * time_ms for offset, slope in pieces)
        return (k - 1) * recomputed + swap_per_byte * min(room, total - recomputed)

    low, high = 0, len(ranked.order)  # the first breakpoint that frees enough
    while low < high:
        middle = (low + high) // 2
        if freed(base + fwd_prefix[middle], saved_prefix[middle]) >= need:
            high = middle
        else:
            low = middle + 1
    if low == 0:
        return base
    layer = ranked.order[low - 1]
    if problem.fwd_ms[layer] == 0:  # recomputing it is free: enough at its breakpoint
        return base + fwd_prefix[low]
    return _segment_time(
        problem,
        base + fwd_prefix[low - 1],
        saved_prefix[low - 1],
        problem.saved_bytes[layer] / problem.fwd_ms[layer],
        total,
    )


def _segment_time(
    problem: StageProblem, start_ms: float, first_bytes: float, rate: float, total: float
) -> float:
    """The least t >= start_ms at which the relaxation frees enough, while the recompute
    budget crosses one layer: recomputed bytes are first_bytes + (t - start_ms) x rate.

    Freed bytes are then the minimum of a few linear functions of t (one per limit on the
    swap room, and the bytes not recomputed), so each gives the t it needs in closed form.
    """
    k, need = problem.inflight, problem.need_bytes
    swap_per_byte = max(0, k - problem.swap_buffers)
    recompute_at0 = first_bytes - start_ms * rate  # recomputed bytes = this + rate x t
    pieces = [(0.0, 0.0)] if not swap_per_byte else _swap_room_pieces(problem)
    if swap_per_byte:
        pieces.append((total - recompute_at0, -rate))
    time_ms = start_ms
    for offset, slope in pieces:
        at0 = (k - 1) * recompute_at0 + swap_per_byte * offset
        growth = (k - 1) * rate + swap_per_byte * slope
        if growth > 0:
            time_ms = max(time_ms, (need - at0) / growth)
    return time_ms * (1 - 1e-12)  # a bound: never above the true least time


def _swap_room_pieces(problem: StageProblem) -> list[tuple[float, float]]:
    """The swap room for t >= F + B as linear functions offset + slope x t; the room is
    their minimum."""
    slope_in = 1 / problem.host_in_bytes_per_ms if problem.host_in_bytes_per_ms else 0.0
    slope_out = 1 / problem.host_out_bytes_per_ms if problem.host_out_bytes_per_ms else 0.0
    pieces = []
    if math.isfinite(problem.swap_limit_bytes):
        pieces.append((problem.swap_limit_bytes, 0.0))
    if problem.swap_mode == "last":
        if slope_in + slope_out:
            slope = slope_in + slope_out
            pieces.append((-problem.base_ms / slope, 1 / slope))
    else:
        head = problem.backward_ms if problem.swap_mode == "warm" else problem.forward_ms
        if slope_in:
            pieces.append((-head / slope_in, 1 / slope_in))
        if slope_out:
            pieces.append((0.0, 1 / slope_out))
    return pieces or [(math.inf, 0.0)]


def _quick(
    problem: StageProblem, ranked: _Ranked, time_ms: float
) -> tuple[list[str], float, int] | None:
    """A sufficient test in O(log n): recompute the best-ranked layers that fit the budget
    and swap the worst-ranked that fit the room, counting a checkpoint for every recomputed
    layer (runs need fewer). The choice, as ``_choose`` gives it, when that frees enough."""
    k, need = problem.inflight, problem.need_bytes
    fwd_prefix, saved_prefix = ranked.fwd_prefix, ranked.saved_prefix
    count = bisect.bisect_right(fwd_prefix, time_ms - problem.base_ms) - 1
    if count < 0:
        return None
    freed = (k - 1) * saved_prefix[count] - k * ranked.input_prefix[count]
    total, first_swap = saved_prefix[-1], len(ranked.order)
    per_byte = k - problem.swap_buffers
    if per_byte > 0 and freed < need:
        room = _swap_room(problem, time_ms)
        first_swap = bisect.bisect_left(saved_prefix, total - room, lo=count)
        freed += per_byte * (total - saved_prefix[first_swap])
    if freed < need:
        return None
    policies = [KEEP] * len(problem.fwd_ms)
    for idx in ranked.order[:count]:
        policies[idx] = RECOMPUTE
    for idx in ranked.order[first_swap:]:
        policies[idx] = SWAP
    return policies, fwd_prefix[count], total - saved_prefix[first_swap]


def _choose(
    problem: StageProblem, ranked: _Ranked, time_ms: float
) -> tuple[list[str], float, int] | None:
    """Whole layers within time ``time_ms`` that free enough, or None (module docstring):
    (policies, recompute ms, swap bytes). The inner loop of the bounded search, so it
    works on plain lists."""
    budget, room = time_ms - problem.base_ms, _swap_room(problem, time_ms)
    best_first, worst_first = ranked.order, ranked.order[::-1]
    for swap_first in (False, True):
        policies = [KEEP] * len(problem.fwd_ms)
        freed, swap_bytes = 0, 0
        if swap_first:
            freed, swap_bytes = _swap_into(problem, policies, worst_first, room, freed, 0)
        freed, recompute_ms = _recompute_into(problem, policies, best_first, budget, freed)
        freed, swap_bytes = _swap_into(problem, policies, worst_first, room, freed, swap_bytes)
        if freed >= problem.need_bytes:
            recompute_ms = _trim(problem, policies, worst_first, freed, recompute_ms)
            return policies, recompute_ms, swap_bytes
    return None


def _recompute_gain(problem: StageProblem, policies: list[str], idx: int) -> int:
    """Freed bytes layer idx adds as a recompute, given its neighbours' policies."""
    k, inputs = problem.inflight, problem.input_bytes
    gain = (k - 1) * problem.saved_bytes[idx]
    if idx == 0 or policies[idx - 1] != RECOMPUTE:
        gain -= k * inputs[idx]
    if idx + 1 < len(policies) and policies[idx + 1] == RECOMPUTE:
        gain += k * inputs[idx + 1]  # that run now starts earlier
    return gain


def _recompute_into(
    problem: StageProblem, policies: list[str], order: list[int], budget_ms: float, freed: int
) -> tuple[int, float]:
    need, fwd = problem.need_bytes, problem.fwd_ms
    recompute_ms = 0.0
    for idx in order:
        if freed >= need:
            break
        if policies[idx] != KEEP or recompute_ms + fwd[idx] > budget_ms:
            continue
        gain = _recompute_gain(problem, policies, idx)
        if gain > 0:
            policies[idx] = RECOMPUTE
            freed += gain
            recompute_ms += fwd[idx]
    return freed, recompute_ms


def _swap_into(
    problem: StageProblem,
    policies: list[str],
    order: list[int],
    room: float,
    freed: int,
    swap_bytes: int,
) -> tuple[int, int]:
    per_byte = problem.inflight - problem.swap_buffers
    if per_byte <= 0:
        return freed, swap_bytes
    need, saved = problem.need_bytes, problem.saved_bytes
    for idx in order:
        if freed >= need:
            break
        size = saved[idx]
        if policies[idx] == KEEP and size and swap_bytes + size <= room:
            policies[idx] = SWAP
            swap_bytes += size
            freed += per_byte * size
    return freed, swap_bytes


def _trim(
    problem: StageProblem, policies: list[str], order: list[int], freed: int, recompute_ms: float
) -> float:
    """Undo recomputes, least worth it first, that the memory no longer needs."""
    for idx in order:
        if policies[idx] != RECOMPUTE:
            continue
        policies[idx] = KEEP
        loss = _recompute_gain(problem, policies, idx)
        if freed - loss >= problem.need_bytes:
            freed -= loss
            recompute_ms -= problem.fwd_ms[idx]
        else:
            policies[idx] = RECOMPUTE
    return recompute_ms


def solve_bounded(
    problem: StageProblem,
    cutoff_ms: float = math.inf,
    floor_ms: float = -math.inf,
    lower_ms: float | None = None,
) -> StageChoice | None:
    """A choice within ``cutoff_ms`` that frees enough, with its lower bound (pass
    ``lower_ms`` when it is known); any choice within ``floor_ms`` is good enough. None when
    none is found within the cutoff."""
    count = len(problem.fwd_ms)
    if problem.need_bytes <= 0:
        return (
            StageChoice(problem.base_ms, (KEEP,) * count, True, problem.base_ms)
            if problem.base_ms <= cutoff_ms
            else None
        )
    ranked = _Ranked.of(problem)
    lower = lower_bound_ms(problem, ranked) if lower_ms is None else lower_ms
    if lower > cutoff_ms:
        return None
    high = min(
        cutoff_ms,
        max(problem.base_ms + ranked.fwd_prefix[-1], problem.swap_ms(ranked.saved_prefix[-1])),
    )
    start = max(lower, floor_ms)
    found = None
    if start <= high:
        found = _quick(problem, ranked, start) or _choose(problem, ranked, start)
    if found is None:
        found = _choose(problem, ranked, high)
        if found is None:
            return None
        time_ms = _bisect_time(lambda t: _choose(problem, ranked, t) is not None, start, high)
        found = _choose(problem, ranked, time_ms) or found
    policies, recompute_ms, swap_bytes = found
    time_ms = problem.time_ms(recompute_ms, swap_bytes)
    return StageChoice(time_ms, tuple(policies), time_ms <= lower * (1 + 1e-12), lower)
