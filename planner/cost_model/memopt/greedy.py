"""Fast choices for a stage's memory subproblem (``exact.py``): the seeds' heuristics.

``solve_greedy`` is vPipe's ranking (TPDS'22 §4.2): layers ranked by the memory a recompute
frees per millisecond, swap for the ones worst to recompute while the transfer hides under
compute, recompute for the best ranked. ``solve_capuchin`` is DawnPiper's cost model (after
Capuchin, ASPLOS'20): swap the largest tensors while the transfer is free, then take, one
layer at a time, whichever of swap and recompute frees the most memory per millisecond the
stage gets slower. Neither is always the fastest; ``memopt.solve_exact`` is.
"""

import math
from collections.abc import Iterable

from pipestudio.planner.cost_model.memopt.exact import (
    KEEP,
    RECOMPUTE,
    SWAP,
    StageChoice,
    StageProblem,
)


class GreedyState:
    """Policies being chosen, with the exact memory they free kept up to date."""

    def __init__(self, problem: StageProblem) -> None:
        self.problem = problem
        self.policies = [KEEP] * len(problem.fwd_ms)
        self.freed = 0
        self.swap_bytes = 0
        self.recompute_ms = 0.0

    @property
    def done(self) -> bool:
        return self.freed >= self.problem.need_bytes

    def time_ms(self) -> float:
        return self.problem.time_ms(self.recompute_ms, self.swap_bytes)

    def choice(self) -> StageChoice:
        return StageChoice(self.time_ms(), tuple(self.policies), False)

    def recompute_gain(self, idx: int) -> int:
        """Change of freed bytes if layer idx becomes recomputed (run starts move)."""
        problem, policies, k = self.problem, self.policies, self.problem.inflight
        gain = (k - 1) * problem.saved_bytes[idx]
        if idx == 0 or policies[idx - 1] != RECOMPUTE:
            gain -= k * problem.input_bytes[idx]
        if idx + 1 < len(policies) and policies[idx + 1] == RECOMPUTE:
            gain += k * problem.input_bytes[idx + 1]  # that run now starts earlier
        return gain

    def swap_gain(self, idx: int) -> int:
        problem = self.problem
        return (problem.inflight - problem.swap_buffers) * problem.saved_bytes[idx]

    def set_swap(self, idx: int) -> None:
        self.policies[idx] = SWAP
        self.swap_bytes += self.problem.saved_bytes[idx]
        self.freed += self.swap_gain(idx)

    def set_recompute(self, idx: int, gain: int) -> None:
        self.policies[idx] = RECOMPUTE
        self.freed += gain
        self.recompute_ms += self.problem.fwd_ms[idx]

    def swap(self, order: Iterable[int], limit: float) -> None:
        """Swap layers in ``order`` while swapped bytes stay within ``limit``."""
        if self.problem.inflight <= self.problem.swap_buffers:
            return
        for idx in order:
            if self.done:
                return
            saved = self.problem.saved_bytes[idx]
            if self.policies[idx] == KEEP and saved and self.swap_bytes + saved <= limit:
                self.set_swap(idx)

    def recompute(self, order: Iterable[int], budget_ms: float = math.inf) -> None:
        """Recompute layers in ``order`` that free memory, within ``budget_ms`` of forwards."""
        for idx in order:
            if self.done:
                return
            if self.policies[idx] != KEEP:
                continue
            if self.recompute_ms + self.problem.fwd_ms[idx] > budget_ms:
                continue
            gain = self.recompute_gain(idx)
            if gain > 0:
                self.set_recompute(idx, gain)

    def trim(self, order: Iterable[int]) -> None:
        """Undo recomputes, in ``order``, that the memory no longer needs."""
        for idx in order:
            if self.policies[idx] != RECOMPUTE:
                continue
            self.policies[idx] = KEEP
            loss = self.recompute_gain(idx)
            if self.freed - loss >= self.problem.need_bytes:
                self.freed -= loss
                self.recompute_ms -= self.problem.fwd_ms[idx]
            else:
                self.policies[idx] = RECOMPUTE


def efficiency(problem: StageProblem, idx: int) -> float:
    """Saved bytes a recompute of layer idx frees per millisecond of forward."""
    fwd = problem.fwd_ms[idx]
    return problem.saved_bytes[idx] / fwd if fwd > 0 else math.inf


def free_swap_bytes(problem: StageProblem) -> float:
    """The most bytes a stage swaps without getting slower."""
    return min(problem.swap_limit_bytes, problem.max_swap_bytes(problem.base_ms))


def solve_greedy(problem: StageProblem, *, swap_first: bool = True) -> StageChoice | None:
    """vPipe's choice (module docstring); None when it frees too little.

    Swap takes the layers worst to recompute, as long as the transfer hides under the
    stage's compute; then recompute takes the best-ranked remaining layers until enough
    memory is free; if that is still not enough, more layers are swapped up to the swap
    limit, which costs time. ``swap_first=False`` recomputes before it swaps.
    """
    if problem.need_bytes <= 0:
        return StageChoice(problem.base_ms, (KEEP,) * len(problem.fwd_ms), False)
    if problem.inflight <= 1:
        return None
    rank = sorted(range(len(problem.fwd_ms)), key=lambda i: efficiency(problem, i))
    state = GreedyState(problem)
    if swap_first:
        state.swap(rank, free_swap_bytes(problem))
    state.recompute(reversed(rank))
    state.swap(rank, problem.swap_limit_bytes)
    if not state.done:
        return None
    state.trim(rank)
    return state.choice()


def solve_capuchin(problem: StageProblem) -> StageChoice | None:
    """DawnPiper's choice (module docstring); None when it frees too little."""
    count = len(problem.fwd_ms)
    if problem.need_bytes <= 0:
        return StageChoice(problem.base_ms, (KEEP,) * count, False)
    if problem.inflight <= 1:
        return None
    state = GreedyState(problem)
    by_size = sorted(range(count), key=lambda i: -problem.saved_bytes[i])
    state.swap(by_size, free_swap_bytes(problem))
    while not state.done:
        best = _best_step(state)
        if best is None:
            return None
        policy, idx, gain = best
        if policy == SWAP:
            state.set_swap(idx)
        else:
            state.set_recompute(idx, gain)
    return state.choice()


def _best_step(state: GreedyState) -> tuple[str, int, int] | None:
    """The kept layer and policy that frees the most bytes per millisecond of stage time."""
    problem = state.problem
    now = state.time_ms()
    best: tuple[float, str, int, int] | None = None
    for idx, policy in enumerate(state.policies):
        if policy != KEEP:
            continue
        gain = state.recompute_gain(idx)
        if gain > 0:
            cost = problem.time_ms(state.recompute_ms + problem.fwd_ms[idx], state.swap_bytes) - now
            rate = gain / cost if cost > 0 else math.inf
            if best is None or rate > best[0]:
                best = (rate, RECOMPUTE, idx, gain)
        saved = problem.saved_bytes[idx]
        swap_gain = state.swap_gain(idx)
        if swap_gain > 0 and state.swap_bytes + saved <= problem.swap_limit_bytes:
            cost = problem.time_ms(state.recompute_ms, state.swap_bytes + saved) - now
            rate = swap_gain / cost if cost > 0 else math.inf
            if best is None or rate > best[0]:
                best = (rate, SWAP, idx, swap_gain)
    return None if best is None else best[1:]
