"""Each antichain state's ancestors in order of compute: the scan order of PipeDream's DP.

The branch and bound of ``dp.py`` scans the split points k of an entry A[i][j][m]
(the ancestors of s_j, SOSP'19 §3.1) sorted by (C(s_k), k), with the running maxima of the
parameter bytes P(s_k) and of A(s_k) + P(s_k) along that order and the minima of A + P after
each position, which bound when a side of the scan can stop. Sorting every column's ancestors
is O(n^2 log n) on an n-layer chain; but when s_j's ancestors are exactly s_0..s_{j-1} (every
state of a chain, and the cut points between the blocks of a residual network) and C is
non-decreasing over them, the sorted order is 0..j-1 itself, so one table over the states,
ordered by index, serves all such columns as its first j entries: the same states, in the
same order, with the same floats (the minima, taken over the whole table, can only be lower).
"""

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pipestudio.planner.algorithms.pipedream.antichains import bits


class AncestorOrder(NamedTuple):
    """A column's ancestors by (C(s), s): the first ``size`` entries of each sequence.

    ``peak_*`` are running maxima from the front (of P, of A + P), ``rest_min_held_bytes[p]``
    the least A + P at positions p and after. A table shared by several columns runs past
    ``size``; its minima then also range over later states, which only lowers them.
    """

    states: Sequence[int]
    compute_s: Sequence[float]
    peak_par_bytes: Sequence[float]
    peak_held_bytes: Sequence[float]
    rest_min_held_bytes: Sequence[float]
    size: int


def _ordered(
    states: Sequence[int],
    compute_s: Sequence[float],
    activation_bytes: Sequence[float],
    parameter_bytes: Sequence[float],
) -> AncestorOrder:
    peak_par, peak_held = [], []
    most_par = most_held = -float("inf")
    for k in states:
        most_par = max(most_par, parameter_bytes[k])
        most_held = max(most_held, activation_bytes[k] + parameter_bytes[k])
        peak_par.append(most_par)
        peak_held.append(most_held)
    rest_min_held = [0.0] * len(states)
    least_held = float("inf")
    for idx in reversed(range(len(states))):
        k = states[idx]
        least_held = min(least_held, activation_bytes[k] + parameter_bytes[k])
        rest_min_held[idx] = least_held
    return AncestorOrder(
        states, [compute_s[k] for k in states], peak_par, peak_held, rest_min_held, len(states)
    )


def _nondecreasing_run(values: Iterable[float]) -> int:
    """How many leading values never decrease (a NaN ends the run)."""
    count, last = 0, -float("inf")
    for value in values:
        if not last <= value:
            break
        count, last = count + 1, value
    return count


class AncestorOrders:
    """``of(col)``: the ancestors of s_col by (C(s), s), computed once per column."""

    def __init__(
        self,
        compute_s: Sequence[float],
        activation_bytes: Sequence[float],
        parameter_bytes: Sequence[float],
        ancestors: Sequence[int],
    ) -> None:
        self.compute_s = compute_s
        self.activation_bytes = activation_bytes
        self.parameter_bytes = parameter_bytes
        self.ancestors = ancestors
        run = _nondecreasing_run(compute_s)
        self._prefix = _ordered(range(run), compute_s, activation_bytes, parameter_bytes)
        self._cache: dict[int, AncestorOrder] = {}

    def of(self, col: int) -> AncestorOrder:
        cached = self._cache.get(col)
        if cached is None:
            if col <= self._prefix.size and self.ancestors[col] == (1 << col) - 1:
                cached = self._prefix._replace(size=col)
            else:
                cached = self.sorted(col)
            self._cache[col] = cached
        return cached

    def sorted(self, col: int) -> AncestorOrder:
        """The general path: sort s_col's ancestors."""
        compute_s = self.compute_s
        states = sorted(bits(self.ancestors[col]), key=lambda k: (compute_s[k], k))
        return _ordered(states, compute_s, self.activation_bytes, self.parameter_bytes)
