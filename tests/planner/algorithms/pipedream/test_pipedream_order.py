"""``pipedream_order``: the shared table of chain-like columns equals sorting each column."""

import random
from pathlib import Path

from pipestudio.planner.algorithms.pipedream.antichains import antichain_dag
from pipestudio.planner.algorithms.pipedream.dp import StateCosts
from pipestudio.planner.algorithms.pipedream.order import AncestorOrder, AncestorOrders
from pipestudio.planner.algorithms.pipedream.planner import dp_graph, state_costs
from pipestudio.planner.formats.pipedream import import_pipedream
from pipestudio.planner.formats.profile import Profile

ROOT = Path(__file__).resolve().parents[4]


def chain_costs(rng: random.Random, num_states: int, *, flat: float = 0.2) -> StateCosts:
    """Running sums of a chain's draws; a share ``flat`` of the steps adds nothing."""
    compute, act, par = [], [], []
    time_s = act_bytes = par_bytes = 0.0
    for _ in range(num_states):
        time_s += 0.0 if rng.random() < flat else rng.uniform(0, 1e-2)
        act_bytes += 0.0 if rng.random() < flat else rng.randrange(10**7)
        par_bytes += 0.0 if rng.random() < flat else rng.randrange(10**8)
        compute.append(time_s)
        act.append(act_bytes)
        par.append(par_bytes)
    ancestors = [(1 << state) - 1 for state in range(num_states)]
    return StateCosts(compute, act, par, [0.0] * num_states, ancestors)


def orders(costs: StateCosts) -> AncestorOrders:
    return AncestorOrders(
        costs.compute_s, costs.activation_bytes, costs.parameter_bytes, costs.ancestors
    )


def assert_same(ours: AncestorOrder, sorted_order: AncestorOrder) -> None:
    size = sorted_order.size
    assert ours.size == size
    for field in ("states", "compute_s", "peak_par_bytes", "peak_held_bytes"):
        assert list(getattr(ours, field)[:size]) == list(getattr(sorted_order, field)), field
    # A shared table's minima also cover later states: never above the column's own.
    assert all(
        a <= b
        for a, b in zip(
            ours.rest_min_held_bytes[:size], sorted_order.rest_min_held_bytes, strict=True
        )
    )


def test_chain_columns_share_one_table_equal_to_sorting() -> None:
    rng = random.Random(2)
    for _ in range(20):
        costs = chain_costs(rng, rng.randint(1, 200))
        table = orders(costs)
        for col in range(len(costs.compute_s)):
            ours = table.of(col)
            assert isinstance(ours.states, range)  # the shared table, no sort
            assert_same(ours, table.sorted(col))


def test_a_drop_in_compute_falls_back_to_sorting() -> None:
    costs = chain_costs(random.Random(4), 30, flat=0.0)
    compute = list(costs.compute_s)
    compute[12] = compute[3]  # below states 4..11: their order by C changes after state 12
    dropped = StateCosts(
        compute,
        costs.activation_bytes,
        costs.parameter_bytes,
        costs.boundary_bytes,
        costs.ancestors,
    )
    table = orders(dropped)
    for col in range(30):
        ours = table.of(col)
        assert isinstance(ours.states, range) == (col <= 12)
        assert_same(ours, table.sorted(col))
    assert list(table.of(20).states)[:6] == [0, 1, 2, 3, 12, 4]


def test_real_graphs_mix_shared_and_sorted_columns() -> None:
    # In a residual network the cut points between blocks have every earlier state as an
    # ancestor; the states inside a block do not.
    for model in ("resnet50", "densenet121", "gnmt"):
        profile: Profile = import_pipedream(ROOT / "profiles" / "pipedream" / model / "graph.txt")
        graph = dp_graph(profile)
        costs = state_costs(profile, graph, antichain_dag(graph.succs, graph.preds))
        table = orders(costs)
        shared = 0
        for col in range(len(costs.compute_s)):
            ours = table.of(col)
            shared += isinstance(ours.states, range)
            assert_same(ours, table.sorted(col))
        assert 0 < shared < len(costs.compute_s)
