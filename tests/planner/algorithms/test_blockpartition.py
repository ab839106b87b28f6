"""torchgpipe's block partition: always terminates with non-empty blocks."""

import random

from pipestudio.planner.algorithms.blockpartition import block_partition


def test_blocks_cover_the_sequence_and_none_is_empty() -> None:
    rng = random.Random(1)
    for _ in range(5000):
        count = rng.randint(1, 9)
        num_blocks = rng.randint(1, count)
        values = [round(rng.uniform(0, 10), 3) for _ in range(count)]
        ends = block_partition(values, num_blocks)
        starts = [0, *ends[:-1]]
        assert len(ends) == num_blocks and ends[-1] == count
        assert all(start < end for start, end in zip(starts, ends, strict=True)), values


def test_one_element_per_block_returns_at_once() -> None:
    # Once looped forever: rounding made the largest block exceed the smallest by > 1.
    assert block_partition([4.681, 5.104, 3.111, 5.199], 4) == [1, 2, 3, 4]


def test_balances_equal_values() -> None:
    assert block_partition([1.0] * 8, 4) == [2, 4, 6, 8]
