"""``pipedream_reach``: it never refuses an entry at its own value, and does refuse below it."""

import math
import random

from pipestudio.planner.algorithms.pipedream.dp import HierarchicalDP, Level, StateCosts
from pipestudio.planner.algorithms.pipedream.reach import ChainReach


def chain_costs(rng: random.Random, num_states: int) -> StateCosts:
    compute, act, par, boundary = [], [], [], []
    time_s = act_bytes = par_bytes = 0.0
    for _ in range(num_states):
        time_s += rng.choice([0.0, rng.uniform(0, 1e-2)])
        act_bytes += rng.randrange(10**7)
        par_bytes += rng.choice([0, rng.randrange(10**8)])
        compute.append(time_s)
        act.append(act_bytes)
        par.append(par_bytes)
        boundary.append(float(rng.randrange(10**7)))
    ancestors = [(1 << state) - 1 for state in range(num_states)]
    return StateCosts(compute, act, par, boundary, ancestors)


def test_never_refuses_an_entry_at_its_value() -> None:
    rng = random.Random(8)
    refused = checked = 0
    for _ in range(40):
        costs = chain_costs(rng, rng.randint(2, 25))
        sizes = rng.choice([[4], [8], [4, 2], [2, 2, 2]])
        levels = [Level(size, rng.choice([1e9, 1e10, math.inf])) for size in sizes]
        held = costs.activation_bytes[-1] + costs.parameter_bytes[-1]
        straight = rng.random() < 0.25
        solver = HierarchicalDP(
            costs, levels, memory_bytes=held * rng.uniform(0.1, 0.6), single_replica=straight
        )
        reach = solver.bounds.reach
        assert isinstance(reach, ChainReach)
        num_states = len(costs.compute_s)
        for lv, level in enumerate(levels):
            for row in range(num_states):
                assert reach.applies(row, num_states - 1)
                for col in range(row, num_states):
                    for m in range(level.num_machines):
                        value = solver.entry(lv, row, col, m, math.inf)
                        if value == math.inf:
                            continue
                        checked += 1
                        assert reach.may_finish(lv, row, col, m, value)
                        refused += not reach.may_finish(lv, row, col, m, value * 0.9)
    assert checked > 1000
    assert refused > checked // 4  # it prunes: most entries cannot finish 10% sooner


def test_applies_only_where_nothing_drops() -> None:
    costs = chain_costs(random.Random(1), 10)
    parameters = list(costs.parameter_bytes)
    parameters[6] = parameters[5] - 1.0  # an irregular stage's parameters can drop
    dropped = StateCosts(
        costs.compute_s, costs.activation_bytes, parameters, costs.boundary_bytes, costs.ancestors
    )
    reach = HierarchicalDP(dropped, [Level(4, 1e9)], memory_bytes=1e9).bounds.reach
    assert reach is not None
    # Row i starts after state i-1: rows up to 6 see the drop from state 5 to state 6.
    assert reach.applies(0, 5) and reach.applies(7, 9)
    assert not reach.applies(0, 6) and not reach.applies(6, 9)
