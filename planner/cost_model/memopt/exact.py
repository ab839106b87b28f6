"""The memory-optimization subproblem of one stage: which layers to recompute or swap.

Under the stage model (``cost_model/stage.py``) a stage's time per micro-batch is

    T = max(F + B + R, g(S))

where R is the forward time of its recomputed layers and g(S) the time the swap of S bytes
per micro-batch needs: g(S) = max(B + S/b_in, S/b_out) for a 1F1B stage with a warm-up,
max(F + S/b_in, S/b_out) for GPipe, F + B + S/b_out + S/b_in for the last 1F1B stage (see
``cost_model/stage.py``; a free host link makes g a constant no larger than F + B). Its peak
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
still a valid choice but not proven optimal, and ``exact`` says so. ``solve_if_small``
gives up at the cap instead: large stages whose Pareto sets stay small are solved exactly
at little cost, the others left to ``memopt_bounded``.
"""

import math
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
    # saved bytes per forward ms of each layer (inf for a free forward), when known already
    worth: tuple[float, ...] | None = None

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
    """A stage's policies and their time; ``lower_ms`` is a proven lower bound on the best
    time of any choice (equal to ``time_ms`` when the choice is known to be the fastest)."""

    time_ms: float
    policies: tuple[str, ...]
    exact: bool
    lower_ms: float | None = None

    @property
    def lower_bound_ms(self) -> float:
        return self.time_ms if self.lower_ms is None else self.lower_ms


# A partial choice: (recompute ms, swap bytes, freed bytes, last is recomputed,
# (parent state, this layer's policy) or None at the start)
_State: TypeAlias = "tuple[float, int, int, bool, tuple[_State, str] | None]"


def solve_exact(
    problem: StageProblem,
    cutoff_ms: float = math.inf,
    max_states: int = 4096,
    floor_ms: float = -math.inf,
) -> StageChoice | None:
    """The fastest choice that frees ``need_bytes`` (see the module docstring), or None when
    none does within ``cutoff_ms``. Any choice within ``floor_ms`` is good enough: the search
    stops at the first one it finds."""
    return _search(problem, cutoff_ms, max_states, floor_ms, give_up=False)[1]


def solve_if_small(
    problem: StageProblem, cutoff_ms: float, max_states: int, floor_ms: float = -math.inf
) -> tuple[bool, StageChoice | None]:
    """``solve_exact`` where its states never outnumber ``max_states``: (True, its answer,
    proven); otherwise (False, None) as soon as they do, so a large stage costs at most
    about its layers x ``max_states`` before a caller falls back to a bounded choice."""
    return _search(problem, cutoff_ms, max_states, floor_ms, give_up=True)


def _search(
    problem: StageProblem, cutoff_ms: float, max_states: int, floor_ms: float, give_up: bool
) -> tuple[bool, StageChoice | None]:
    """The program of the module docstring: (whether it ran to the end, its answer)."""
    count = len(problem.fwd_ms)
    if problem.need_bytes <= 0:
        return True, (
            StageChoice(problem.base_ms, (KEEP,) * count, True)
            if problem.base_ms <= cutoff_ms
            else None
        )
    k, c = problem.inflight, problem.swap_buffers
    if k <= 1:
        return True, None  # with one micro-batch in flight no policy frees memory
    max_recompute = cutoff_ms - problem.base_ms
    max_swap = min(problem.max_swap_bytes(cutoff_ms), problem.swap_limit_bytes)
    if max_recompute < 0:
        return True, None
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
                children.append(
                    (recompute, swap + saved, freed + (k - c) * saved, False, (state, SWAP))
                )
        states = []
        for child in children:
            recompute, swap, freed = child[0], child[1], child[2]
            if freed >= problem.need_bytes:
                time_ms = problem.time_ms(recompute, swap)
                if time_ms <= cutoff_ms and (best is None or time_ms < best[0]):
                    best = (time_ms, child, idx)
                    if time_ms <= floor_ms:
                        return True, StageChoice(time_ms, _policies(child, idx, count), exact)
                continue
            if freed + potential[idx + 1] < problem.need_bytes:
                continue
            states.append(child)
        states = _pareto(states)
        if len(states) > max_states:
            if give_up:
                return False, None
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
        return True, None
    return True, StageChoice(best[0], _policies(best[1], best[2], count), exact)


def _pareto(states: list[_State]) -> list[_State]:
    """Drop states dominated by another (see the module docstring).

    States are visited by recompute time, so every kept state has no more of it; a state is
    dominated when a kept one with no more swap frees at least as much and has a recomputed
    last layer or the same last layer. Two max-trees over swap ranks, one per kind of last
    layer, answer "most freed with swap <= x" in O(log n).
    """
    states.sort(key=lambda s: (s[0], s[1], -s[2], not s[3]))
    swaps = sorted({s[1] for s in states})
    rank = {swap: idx + 1 for idx, swap in enumerate(swaps)}
    size = len(swaps)
    none = -math.inf  # freed bytes can be negative: a lone recompute costs its checkpoint
    most = {True: [none] * (size + 1), False: [none] * (size + 1)}  # Fenwick trees of max
    kept: list[_State] = []
    for state in states:
        position, freed, last_rc = rank[state[1]], state[2], state[3]
        best, idx = none, position
        while idx:
            best = max(best, most[True][idx], none if last_rc else most[False][idx])
            idx -= idx & -idx
        if best >= freed:
            continue
        kept.append(state)
        tree, idx = most[last_rc], position
        while idx <= size:
            if tree[idx] < freed:
                tree[idx] = freed
            idx += idx & -idx
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
