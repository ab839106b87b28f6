"""Range maximum queries in O(1) after O(n log n) preparation (a sparse table)."""

from collections.abc import Sequence


class RangeMax:
    """max(values[i:j]) for any 0 <= i < j <= len(values)."""

    def __init__(self, values: Sequence[float]) -> None:
        self._levels: list[list[float]] = [list(values)]
        width = 1
        while 2 * width <= len(values):
            previous = self._levels[-1]
            self._levels.append(
                [max(previous[i], previous[i + width]) for i in range(len(previous) - width)]
            )
            width *= 2

    def __call__(self, start: int, end: int) -> float:
        level = (end - start).bit_length() - 1
        row = self._levels[level]
        return max(row[start], row[end - (1 << level)])
