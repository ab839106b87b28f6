"""``pipedream_bounds``: the memory caps, by hand and against every way to cut the machines."""

import itertools
import math

import pytest

from pipestudio.planner.algorithms.pipedream.bounds import memory_caps


def test_memory_caps_by_hand() -> None:
    # 4 machines, 12 bytes. Straight: stages stash 3, 2, 1 copies: 4, 4 + 6, 4 + 6 + 12.
    assert memory_caps(4, 12.0, single_replica=True) == [0.0, 4.0, 10.0, 22.0]
    # Replicated: machines 1-2 as one stage stash ceil(2 / 2) = 1 copy, so hold 12; the best
    # for three is 1-2 then 3 (12 + 12), not 1 then 2-3 (4 + 12) nor one stage (12).
    assert memory_caps(4, 12.0, single_replica=False) == [0.0, 4.0, 12.0, 24.0]
    assert memory_caps(3, None, single_replica=False) == [0.0, math.inf, math.inf]


def compositions(total: int) -> list[tuple[int, ...]]:
    """Every way to cut ``total`` machines into stages, as the stages' replica counts."""
    result = []
    for cuts in itertools.product([False, True], repeat=total - 1):
        sizes, size = [], 1
        for cut in cuts:
            if cut:
                sizes.append(size)
                size = 1
            else:
                size += 1
        result.append((*sizes, size))
    return result


@pytest.mark.parametrize("machines", [2, 3, 5, 8])
def test_memory_caps_are_the_best_cut(machines: int) -> None:
    memory = 1e9
    for straight in (False, True):
        caps = memory_caps(machines, memory, straight)
        for used in range(1, machines):
            best = 0.0
            for stages in compositions(used):
                if straight and max(stages) > 1:
                    continue
                ends = itertools.accumulate(stages)
                best = max(
                    best,
                    sum(
                        memory / math.ceil((machines - end) / replicas)
                        for end, replicas in zip(ends, stages, strict=True)
                    ),
                )
            assert caps[used] == pytest.approx(best, rel=1e-12)
