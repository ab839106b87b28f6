"""The memory-optimization subproblem of one stage: which layers to recompute or swap.

Under the stage model (``stage_model.py``) a stage's time per micro-batch is

    T = max(F + B + R, g(S))

where R is the forward time of its recomputed layers and g(S) the time the swap of S bytes
per micro-batch needs: g(S) = max(B + S/b_in, S/b_out) for a 1F1B stage with a warm-up,
max(F + S/b_in, S/b_out) for GPipe, F + B + S/b_out + S/b_in for the last 1F1B stage (see
``stage_model.py``; a free host link makes g a constant no larger than F + B). Its peak
memory is

    M = static + workspace + k x (kept + checkpoints) + recomputed + c x S

so compared with keeping every layer, recomputing a layer frees (k - 1) x its saved bytes
and swapping it (k - c) x; a run of consecutive recomputed layers also keeps its input (the
checkpoint), k x per run. The problem: reach M <= the device memory with the smallest T.

Swap is limited to what the host link sends out within the shorter of the stage's forward
and backward (S / b_out <= min(F, B)). Then each swap-out ends before the next forward
ends, swapped tensors never pile up on the device, and c (2 with a warm-up, else 1) is
exact; a slower link would hold more than the model counts.

``solve_exact`` answers it exactly with a dynamic program over the stage's layers in order
that keeps only Pareto-optimal partial choices: a state (R, S, freed bytes, whether the last
layer is recomputed) is dropped when another has R and S no larger, freed no smaller and the
same or a recomputed last layer. A state that already frees enough takes no more work; one
that cannot free enough even by recomputing every remaining layer is dropped; a cutoff on T
bounds R and S. The number of states kept per layer is capped; past the cap the answer is
still a valid choice but not proven optimal, and ``exact`` says so.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

KEEP, RECOMPUTE, SWAP = "keep", "recompute", "swap"
_POLICY = (KEEP, RECOMPUTE, SWAP)


@dataclass(frozen=True)
class StageProblem:
    """One stage's layers (in order) and what its time and memory depend on."""

    fwd_ms: tuple[float, ...]
    saved_bytes: tuple[int, ...]
    input_bytes: tuple[int, ...]  # what a run of recomputed layers starting here keeps
    forward_ms: float
    backward_ms: float
    inflight: int
    swap_buffers: int
    need_bytes: int  # memory to free below keeping every layer (<= 0: keep all)
    swap_mode: str  # "warm", "gpipe" or "last" (see the module docstring)
    host_in_bytes_per_ms: float | None
    host_out_bytes_per_ms: float | None

    @property
    def base_ms(self) -> float:
        return self.forward_ms + self.backward_ms

    def swap_ms(self, swap_bytes: float) -> float:
        """g(S): the stage time the swap of ``swap_bytes`` per micro-batch needs."""
        back = swap_bytes / self.host_in_bytes_per_ms if self.host_in_bytes_per_ms else 0.0
        out = swap_bytes / self.host_out_bytes_per_ms if self.host_out_bytes_per_ms else 0.0
        if self.swap_mode == "last":
            return self.base_ms + out + back
        head = self.backward_ms if self.swap_mode == "warm" else self.forward_ms
        return max(head + back, out)

    @property
    def swap_limit_bytes(self) -> float:
        """The most bytes the host link sends out within min(F, B) (module docstring)."""
        if not self.host_out_bytes_per_ms:
            return math.inf
        return self.host_out_bytes_per_ms * min(self.forward_ms, self.backward_ms)

    def max_swap_bytes(self, time_ms: float) -> float:
        """The most bytes g allows within ``time_ms`` (inverse of ``swap_ms``)."""
        slope_in = 1 / self.host_in_bytes_per_ms if self.host_in_bytes_per_ms else 0.0
        slope_out = 1 / self.host_out_bytes_per_ms if self.host_out_bytes_per_ms else 0.0
        if self.swap_mode == "last":
            room, slope = time_ms - self.base_ms, slope_in + slope_out
            limits = [room / slope] if slope else []
            return -1.0 if room < 0 else min(limits, default=math.inf)
        head = self.backward_ms if self.swap_mode == "warm" else self.forward_ms
        limits = []
        if slope_in:
            limits.append((time_ms - head) / slope_in)
        elif time_ms < head:
            return -1.0
        if slope_out:
            limits.append(time_ms / slope_out)
        return min(limits, default=math.inf)

    def time_ms(self, recompute_ms: float, swap_bytes: float) -> float:
        return max(self.base_ms + recompute_ms, self.swap_ms(swap_bytes))

    def freed_bytes(self, policies: list[str]) -> int:
        """Memory freed by ``policies`` compared with keeping every layer."""
        k, c = self.inflight, self.swap_buffers
        freed, previous = 0, KEEP
        for idx, policy in enumerate(policies):
            if policy == RECOMPUTE:
                freed += (k - 1) * self.saved_bytes[idx]
                if previous != RECOMPUTE:
                    freed -= k * self.input_bytes[idx]
            elif policy == SWAP:
                freed += (k - c) * self.saved_bytes[idx]
            previous = policy
        return freed


@dataclass(frozen=True)
class StageChoice:
    time_ms: float
    policies: tuple[str, ...]
    exact: bool


# A partial choice: (recompute ms, swap bytes, freed bytes, last is recomputed,
# (parent state, this layer's policy) or None at the start)
_State: TypeAlias = "tuple[float, int, int, bool, tuple[_State, str] | None]"


def solve_exact(problem: StageProblem, cutoff_ms: float = math.inf, max_states: int = 4096,
                floor_ms: float = -math.inf) -> StageChoice | None:
    """The fastest choice that frees ``need_bytes`` (see the module docstring), or None when
    none does within ``cutoff_ms``. Any choice within ``floor_ms`` is good enough: the search
    stops at the first one it finds."""
    count = len(problem.fwd_ms)
    if problem.need_bytes <= 0:
        return StageChoice(problem.base_ms, (KEEP,) * count, True) \
            if problem.base_ms <= cutoff_ms else None
    k, c = problem.inflight, problem.swap_buffers
    if k <= 1:
        return None  # with one micro-batch in flight no policy frees memory
    max_recompute = cutoff_ms - problem.base_ms
    max_swap = min(problem.max_swap_bytes(cutoff_ms), problem.swap_limit_bytes)
    if max_recompute < 0:
        return None
    best: tuple[float, _State, int] | None = None
    exact = True
    # What the remaining layers can free at most: recompute each (no checkpoint).
    potential = [0] * (count + 1)
    for idx in range(count - 1, -1, -1):
        potential[idx] = potential[idx + 1] + (k - 1) * problem.saved_bytes[idx]
    states: list[_State] = [(0.0, 0, 0, False, None)]
    for idx in range(count):
        fwd, saved, inp = problem.fwd_ms[idx], problem.saved_bytes[idx], problem.input_bytes[idx]
        children: list[_State] = []
        for state in states:
            recompute, swap, freed, last_rc = state[0], state[1], state[2], state[3]
            children.append((recompute, swap, freed, False, (state, KEEP)))
            if recompute + fwd <= max_recompute:
                gain = (k - 1) * saved - (0 if last_rc else k * inp)
                children.append((recompute + fwd, swap, freed + gain, True, (state, RECOMPUTE)))
            if k > c and saved and swap + saved <= max_swap:
                children.append((recompute, swap + saved, freed + (k - c) * saved, False,
                                 (state, SWAP)))
        states = []
        for child in children:
            recompute, swap, freed = child[0], child[1], child[2]
            if freed >= problem.need_bytes:
                time_ms = problem.time_ms(recompute, swap)
                if time_ms <= cutoff_ms and (best is None or time_ms < best[0]):
                    best = (time_ms, child, idx)
                    if time_ms <= floor_ms:
                        return StageChoice(time_ms, _policies(child, idx, count), exact)
                continue
            if freed + potential[idx + 1] < problem.need_bytes:
                continue
            states.append(child)
        states = _pareto(states)
        if len(states) > max_states:
            exact = False
            states.sort(key=lambda s: (problem.time_ms(s[0], s[1]), -s[2]))
            states = states[:max_states]
        if best is not None:
            # Nothing that needs more time than the best found can win.
            limit = best[0]
            states = [s for s in states if problem.time_ms(s[0], s[1]) < limit]
        if not states:
            break
    if best is None:
        return None
    return StageChoice(best[0], _policies(best[1], best[2], count), exact)


def _pareto(states: list[_State]) -> list[_State]:
    """Drop states dominated by another (see the module docstring)."""
    states.sort(key=lambda s: (s[0], s[1], -s[2], not s[3]))
    kept: list[_State] = []
    for state in states:
        swap, freed, last_rc = state[1], state[2], state[3]
        if any(o[1] <= swap and o[2] >= freed and (o[3] or not last_rc) for o in kept):
            continue  # kept states come first in R, so o[0] <= recompute
        kept.append(state)
    return kept


def _policies(found: _State, last_idx: int, count: int) -> tuple[str, ...]:
    """Follow back-pointers from the winning state; layers after ``last_idx`` are kept."""
    chosen: list[str] = []
    back = found[4]
    while back is not None:
        parent, policy = back
        chosen.append(policy)
        back = parent[4]
    chosen.reverse()
    assert len(chosen) == last_idx + 1
    return tuple(chosen) + (KEEP,) * (count - len(chosen))


def solve_greedy(problem: StageProblem, *, swap_first: bool = True) -> StageChoice | None:
    """A fast choice, not always the fastest: the ranking heuristic of vPipe's SRP planner.

    Layers are ranked by the memory a recompute frees per millisecond (saved bytes over
    forward time). Swap takes the layers that are worst to recompute, as long as the transfer
    hides under the stage's compute (g(S) <= F + B); then recompute takes the best-ranked
    remaining layers until enough memory is free; if that is still not enough, more layers are
    swapped up to the swap limit, which costs time. ``swap_first=False`` recomputes before it
    swaps (the other order of vPipe's choice).
    """
    count = len(problem.fwd_ms)
    policies = [KEEP] * count
    if problem.need_bytes <= 0:
        return StageChoice(problem.base_ms, tuple(policies), False)
    k = problem.inflight
    if k <= 1:
        return None
    rank = sorted(range(count), key=lambda i: _efficiency(problem, i))  # worst first
    free_swap = min(problem.swap_limit_bytes, problem.max_swap_bytes(problem.base_ms))
    state = _Greedy(problem, policies)
    if swap_first:
        state.swap(rank, free_swap)
    state.recompute(reversed(rank))
    state.swap(rank, problem.swap_limit_bytes)
    if state.freed < problem.need_bytes:
        return None
    state.trim(rank)
    return StageChoice(problem.time_ms(state.recompute_ms, state.swap_bytes),
                       tuple(policies), False)


def _efficiency(problem: StageProblem, idx: int) -> float:
    fwd = problem.fwd_ms[idx]
    return problem.saved_bytes[idx] / fwd if fwd > 0 else math.inf


class _Greedy:
    """Policies being chosen, with the exact memory they free kept up to date."""

    def __init__(self, problem: StageProblem, policies: list[str]) -> None:
        self.problem, self.policies = problem, policies
        self.freed = 0
        self.swap_bytes = 0
        self.recompute_ms = 0.0

    def _recompute_gain(self, idx: int) -> int:
        """Change of freed bytes if layer idx becomes recomputed (run starts move)."""
        problem, policies, k = self.problem, self.policies, self.problem.inflight
        gain = (k - 1) * problem.saved_bytes[idx]
        if idx == 0 or policies[idx - 1] != RECOMPUTE:
            gain -= k * problem.input_bytes[idx]
        if idx + 1 < len(policies) and policies[idx + 1] == RECOMPUTE:
            gain += k * problem.input_bytes[idx + 1]  # that run now starts earlier
        return gain

    def swap(self, order: list[int], limit: float) -> None:
        problem = self.problem
        per_byte = problem.inflight - problem.swap_buffers
        if per_byte <= 0:
            return
        for idx in order:
            if self.freed >= problem.need_bytes:
                return
            saved = problem.saved_bytes[idx]
            if self.policies[idx] == KEEP and saved and self.swap_bytes + saved <= limit:
                self.policies[idx] = SWAP
                self.swap_bytes += saved
                self.freed += per_byte * saved

    def recompute(self, order: Iterable[int]) -> None:
        for idx in order:
            if self.freed >= self.problem.need_bytes:
                return
            if self.policies[idx] != KEEP:
                continue
            gain = self._recompute_gain(idx)
            if gain > 0:
                self.freed += gain
                self.policies[idx] = RECOMPUTE
                self.recompute_ms += self.problem.fwd_ms[idx]

    def trim(self, order: list[int]) -> None:
        """Undo recomputes, costliest per byte first, that the memory no longer needs."""
        for idx in order:
            if self.policies[idx] != RECOMPUTE:
                continue
            self.policies[idx] = KEEP
            loss = self._recompute_gain(idx)
            if self.freed - loss >= self.problem.need_bytes:
                self.freed -= loss
                self.recompute_ms -= self.problem.fwd_ms[idx]
            else:
                self.policies[idx] = RECOMPUTE
