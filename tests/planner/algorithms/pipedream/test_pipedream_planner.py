"""The ``pipedream`` planner: hand-computed graphs, errors, and parity with PipeDream's optimizer.

Parity data (tests/planner/data/pipedream_reference.json) was recorded by running
msr-fiddle/pipedream's optimizer at commit 11c40c0 on profiles/pipedream; each record keeps its
exact arguments. The planner is the optimizer with ``--activation_compression_ratio 1``, so it
is compared with those runs; the runs without that flag check the DP alone, with the
communication terms off as the optimizer leaves them by default.

Ties. Among equally fast plans the optimizer keeps the first it meets in the iteration order
of a Python set of objects (memory addresses), so which one it prints is arbitrary, and repeats
with other hash seeds printed different ones (``replica_patterns``). A plan is accepted when
its objective equals the optimizer's (relative 1e-9; the optimizer's own sums vary in the last
bits between runs) and either its stage count and replicas per stage equal one of the
recorded plans, or, for another equally fast plan, its cost recomputed stage by stage from the
optimizer's cost model (``chain_cost_s`` below, independent of the search) equals the same
optimum. Node sets are not compared: ties often move a cheap layer across a boundary. (The
recorded patterns come from the optimizer's stage-id dump, which has no stage that got no
layer; see ``test_irregular_and_empty_stages_as_in_pipedream``.)
"""

import json
import math
import random
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from pipestudio.planner import Profile, cluster_template, simulate
from pipestudio.planner.algorithms.pipedream.antichains import MAX_STATES, antichain_dag, bits
from pipestudio.planner.algorithms.pipedream.dp import HierarchicalDP, Level, StateCosts
from pipestudio.planner.algorithms.pipedream.planner import dp_graph, pipedream, state_costs
from pipestudio.planner.algorithms.request import (
    InfeasibleError,
    PlannerOutput,
    PlanRequest,
    memory_only_cluster,
)
from pipestudio.planner.errors import PlannerError
from pipestudio.planner.formats.pipedream import import_pipedream
from pipestudio.planner.formats.plan import resolve_plan
from tests.planner.helpers import block_chain

ROOT = Path(__file__).resolve().parents[4]
DATA = json.loads(
    (Path(__file__).resolve().parents[2] / "data" / "pipedream_reference.json").read_text()
)
WITH_COMM = [r for r in DATA["records"] if r["activation_compression_ratio"] == 1.0]
WITHOUT_COMM = [r for r in DATA["records"] if r["activation_compression_ratio"] is None]
MICROBATCHES = 10080  # 2**5 * 3**2 * 5 * 7: divisible by every replica count of a level
# of up to 8 devices times one of up to 4 (the largest reference cluster is 8 x 4)
GBPS_10 = 10.0  # 1.25e9 bytes/s


def layer(
    name: str,
    fwd_ms: float,
    bwd_ms: float,
    *,
    output_bytes: int = 0,
    param_bytes: int = 0,
    kind: str = "Linear",
) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "fwd_ms": fwd_ms,
        "bwd_ms": bwd_ms,
        "output_bytes": output_bytes,
        "saved_bytes": output_bytes,
        "param_bytes": param_bytes,
    }


def chain3() -> Profile:
    """a, b, c: 10, 20, 30 ms; outputs 1.25, 2.5, 1 MB; only c has parameters (12.5 MB)."""
    return Profile.model_validate(
        {
            "model": "chain3",
            "microbatch_size": 1,
            "layers": [
                layer("a", 4, 6, output_bytes=1_250_000),
                layer("b", 8, 12, output_bytes=2_500_000),
                layer("c", 12, 18, output_bytes=1_000_000, param_bytes=12_500_000),
            ],
        }
    )


def diamond() -> Profile:
    """in -> x -> (y, z) -> w, and y -> g (a ``__getitem__`` sink)."""
    layers = [
        layer("in", 0, 0, output_bytes=9_999, kind="Input"),
        layer("x", 4, 6, output_bytes=25_000_000),
        layer("y", 8, 12, output_bytes=2_500_000),
        layer("g", 0, 0, output_bytes=7, kind="__getitem__"),
        layer("z", 10, 15, output_bytes=1_250_000),
        layer("w", 8, 12, output_bytes=1_000_000),
    ]
    edges = [("in", "x"), ("x", "y"), ("x", "z"), ("y", "w"), ("z", "w"), ("y", "g")]
    return Profile.model_validate(
        {
            "model": "diamond",
            "microbatch_size": 1,
            "layers": layers,
            "edges": [{"src": s, "dst": d} for s, d in edges],
        }
    )


def request(
    profile: Profile,
    devices: list[int],
    gbps: list[float | None],
    *,
    single_replica: bool = False,
    memory: int | None = None,
    microbatches: int = 12,
    microbatch_size: int | None = None,
) -> PlanRequest:
    cluster = cluster_template(devices, gbps, device_memory_bytes=memory)
    return PlanRequest(
        profile=profile,
        num_microbatches=microbatches,
        schedule="pipedream",
        cluster=cluster,
        single_replica=single_replica,
        microbatch_size=microbatch_size,
    )


def shape(output: PlannerOutput) -> list[tuple[list[str], int]]:
    return [(stage.layers, stage.replicas) for stage in output.plan.stages]


# --- hand-computed -------------------------------------------------------------------------


def test_chain_replicated_by_hand() -> None:
    # One stage on 3 replicas: (60 ms + 4 * 2 * 12.5 MB / (1.25 GB/s * 3)) / 3 = 260/9 ms.
    # Every pipeline is slower: [a,b] then [c] is 30 ms, [a] then [b,c] on 2 replicas 35 ms.
    output = pipedream(request(chain3(), [3], [GBPS_10]))
    assert output.objective_ms == pytest.approx(260 / 9, rel=1e-12)
    assert shape(output) == [(["a", "b", "c"], 3)]
    assert output.details["time_per_minibatch_s"] == pytest.approx(0.26 / 9, rel=1e-12)


def test_chain_straight_by_hand() -> None:
    # 3 devices: [a] [b] [c] = max(10, 20, 30 ms; transfers 2 * 2.5 MB / 1.25 GB/s = 4 ms).
    three = pipedream(request(chain3(), [3], [GBPS_10], single_replica=True))
    assert three.objective_ms == pytest.approx(30.0, rel=1e-12)
    assert shape(three) == [(["a"], 1), (["b"], 1), (["c"], 1)]
    # 2 devices: [a,b] [c] = max(30, 30, 4) beats [a] [b,c] = 50 ms.
    two = pipedream(request(chain3(), [2], [GBPS_10], single_replica=True))
    assert two.objective_ms == pytest.approx(30.0, rel=1e-12)
    assert shape(two) == [(["a", "b"], 1), (["c"], 1)]


def test_free_links_cost_nothing() -> None:
    # No all-reduce and no transfer: data parallelism over 3 devices, 60 / 3 ms.
    output = pipedream(request(chain3(), [3], [None]))
    assert output.objective_ms == pytest.approx(20.0, rel=1e-12)
    assert shape(output) == [(["a", "b", "c"], 3)]


def test_memory_constraint_by_hand() -> None:
    # Straight on 3: [a] stashes ceil(2/1) * 1.25 MB = 2.5 MB, [b] ceil(1/1) * 2.5 MB.
    fits = pipedream(request(chain3(), [3], [GBPS_10], single_replica=True, memory=2_500_000))
    assert fits.objective_ms == pytest.approx(30.0, rel=1e-12)
    with pytest.raises(InfeasibleError, match="2499999 bytes per device"):
        pipedream(request(chain3(), [3], [GBPS_10], single_replica=True, memory=2_499_999))


def test_microbatch_size_rescales_times_and_activations() -> None:
    output = pipedream(request(chain3(), [3], [GBPS_10], single_replica=True, microbatch_size=2))
    assert output.objective_ms == pytest.approx(60.0, rel=1e-12)
    assert output.plan.microbatch_size == 2


def test_diamond_antichain_states_by_hand() -> None:
    graph = dp_graph(diamond())  # DP nodes x, y, z, w = 0, 1, 2, 3; in and g removed
    assert [diamond().layers[i].name for i in graph.layers] == ["x", "y", "z", "w"]
    dag = antichain_dag(graph.succs, graph.preds)
    # Discovered [x], [y], [z], [z,y], [w]; depth-first reverse post-order puts [z] first.
    assert [sorted(bits(down)) for down in dag.down_sets] == [
        [0],
        [0, 2],
        [0, 1],
        [0, 1, 2],
        [0, 1, 2, 3],
    ]
    # x's output is still needed by y after [z] and by z after [y]; PipeDream tests each
    # member's own cone, so x also joins [y, z]'s boundary although both its consumers are in.
    assert dag.augmented == ((0,), (0, 2), (0, 1), (0, 2, 1), (3,))
    assert [sorted(bits(anc)) for anc in dag.ancestors] == [[], [0], [0], [0, 1, 2], [0, 1, 2, 3]]
    assert dag.longest_chain() == 4  # [x] [z] [y, z] [w]: at most 4 stages


def test_diamond_straight_by_hand() -> None:
    # Cut after {x, z}: max(35, 40 ms, transfer 2 * (25 + 1.25) MB / 1.25 GB/s = 42 ms) = 42.
    # After {x, y}: max(30, 45, 44) = 45; after {x}: 65; after {x, y, z}: 55.
    output = pipedream(request(diamond(), [2], [GBPS_10], single_replica=True))
    assert output.objective_ms == pytest.approx(42.0, rel=1e-12)
    # The Input joins the first stage, the __getitem__ sink its producer y.
    assert shape(output) == [(["in", "x", "z"], 1), (["y", "g", "w"], 1)]


def test_two_levels_by_hand() -> None:
    # a 10 ms, b 30 ms with 125 MB of parameters; 2 servers (10 Gbit/s) of 2 devices (100).
    # Inner: [a] on 2 = 5 ms, [b] on 2 = (30 + 4 * 125 MB / (12.5 GB/s * 2)) / 2 = 25 ms,
    # [a,b] on 2 = 30 ms. Outer: both on 2 servers = (30 + 200 / 2) / 2 = 65 ms;
    # [a] then [b], one server each = max(5, 25, 2 ms transfer) = 25 ms.
    profile = Profile.model_validate(
        {
            "model": "two",
            "microbatch_size": 1,
            "layers": [
                layer("a", 4, 6, output_bytes=1_250_000),
                layer("b", 12, 18, param_bytes=125_000_000),
            ],
        }
    )
    output = pipedream(request(profile, [2, 2], [100.0, GBPS_10]))
    assert output.objective_ms == pytest.approx(25.0, rel=1e-12)
    assert shape(output) == [(["a"], 2), (["b"], 2)]
    assert output.details["replicas_per_level"] == [[2, 1], [2, 1]]


def test_plan_simulates() -> None:
    plan_request = request(diamond(), [2], [GBPS_10], single_replica=True, microbatches=4)
    output = pipedream(plan_request)
    assert simulate(plan_request.scaled, output.plan, plan_request.cluster).step_time_ms > 0


# --- the fast search against the optimizer's full tables --------------------------------------


def naive_optimum(
    costs: StateCosts,
    levels: list[Level],
    memory: float | None,
    single_replica: bool,
    ratio: float | None,
) -> float:
    """``compute_partitioning`` as published: every entry of every table, every row below the
    top level (so irregular stages included), in its loop order; INF when no plan exists."""
    comp, act, par, out = (
        list(costs.compute_s),
        list(costs.activation_bytes),
        list(costs.parameter_bytes),
        list(costs.boundary_bytes),
    )
    n = len(comp)
    anc = [list(bits(mask)) for mask in costs.ancestors]

    def diff(values: list[float], i: int, j: int) -> float:
        return values[j] - values[i - 1] if i else values[j]

    segment = {(i, j): diff(comp, i, j) for i in range(n) for j in range(i, n)}
    width, table = 1, {}
    for lv, level in enumerate(levels):
        machines, bandwidth = level.num_machines, level.bandwidth_bytes_per_s
        rows = [0] if lv == len(levels) - 1 else list(range(n))
        table = {}
        for i in rows:
            for j in range(i, n):
                for m in range(machines):
                    best = math.inf
                    held = diff(act, i, j) + diff(par, i, j)
                    if (m == 0 or not single_replica) and (
                        memory is None or math.ceil((machines - m - 1) / (m + 1)) * held <= memory
                    ):
                        all_reduce = 4 * m * diff(par, i, j) / (bandwidth * (m + 1))
                        best = (segment[i, j] + all_reduce / width) / (m + 1)
                    for k in (k for k in anc[j] if k >= i):
                        for r in range(1, min(m, 1 if single_replica else m) + 1):
                            cum_par = par[j] - par[k]
                            if (
                                memory is not None
                                and (act[j] - act[k] + cum_par) * math.ceil((machines - m - 1) / r)
                                > memory
                            ):
                                continue
                            last = (segment[k + 1, j] + 4 * (r - 1) * cum_par / (bandwidth * r)) / r
                            value = max(table[i, k, m - r], last)
                            if ratio is not None:
                                value = max(value, 2.0 * out[k] / (bandwidth * r) / ratio)
                                if j < n - 1:
                                    value = max(value, 2.0 * out[j] / (bandwidth * r) / ratio)
                            best = min(best, value)
                    table[i, j, m] = best
        segment = {(i, j): table[i, j, machines - 1] for i in rows for j in range(i, n)}
        width = machines
    return table[0, n - 1, levels[-1].num_machines - 1]


def random_graph(rng: random.Random) -> Profile:
    """A chain of single layers and of blocks of 2-3 parallel branches (0-2 layers each)."""
    layers: list[dict[str, Any]] = []
    edges: list[tuple[int, int]] = []

    def add(kind: str = "Conv") -> int:
        idle = rng.random() < 0.2
        layers.append(
            layer(
                f"n{len(layers)}",
                0 if idle else rng.uniform(0, 5),
                0 if idle else rng.uniform(0, 8),
                kind=kind,
                output_bytes=rng.randrange(10**8),
                param_bytes=rng.choice([0, rng.randrange(10**9)]),
            )
        )
        return len(layers) - 1

    head = add()
    if rng.random() < 0.3:
        layers[head].update(kind="Input", fwd_ms=0.0, bwd_ms=0.0)
        edges.append((head, head + 1))
        head = add()
    for _ in range(rng.randint(1, 4)):
        ends = []
        for _ in range(rng.choice([1, 2, 2, 3])):
            tail = head
            for _ in range(rng.randint(0, 2)):
                edges.append((tail, len(layers)))
                tail = add()
            ends.append(tail)
        join = add("Add")
        edges.extend((end, join) for end in dict.fromkeys(ends))
        head = join
    return Profile.model_validate(
        {
            "model": "random",
            "microbatch_size": 1,
            "layers": layers,
            "edges": [{"src": f"n{s}", "dst": f"n{d}"} for s, d in edges],
        }
    )


def test_search_equals_the_full_tables() -> None:
    rng = random.Random(7)
    solved = 0
    for _ in range(250):
        profile = random_graph(rng)
        graph = dp_graph(profile)
        costs = state_costs(profile, graph, antichain_dag(graph.succs, graph.preds))
        sizes = rng.choice([[1], [2], [3], [4], [6], [2, 2], [3, 2], [2, 3], [4, 2], [2, 2, 2]])
        levels = [Level(size, rng.choice([1e8, 1e9, 1e10, math.inf])) for size in sizes]
        memory = rng.choice([None, None, float(rng.randrange(10**7, 3 * 10**9))])
        straight, ratio = rng.random() < 0.25, rng.choice([None, 1.0])
        expected = naive_optimum(costs, levels, memory, straight, ratio)
        solver = HierarchicalDP(
            costs,
            levels,
            memory_bytes=memory,
            single_replica=straight,
            activation_compression_ratio=ratio,
        )
        optimum = solver.optimum_s()
        if math.isinf(expected):
            assert optimum is None
            continue
        solved += 1
        assert optimum is not None
        assert math.isclose(optimum, expected, rel_tol=1e-9, abs_tol=1e-15)
        splits = [[list(split) for split in level] for level in solver.level_splits()]
        cost = chain_cost_s(
            costs,
            levels,
            splits,
            memory,
            ratio is not None,
            len(levels) - 1,
            0,
            len(costs.compute_s),
        )
        assert math.isclose(cost, optimum, rel_tol=1e-9, abs_tol=1e-15)
    assert solved >= 200


# --- errors ----------------------------------------------------------------------------------


def test_needs_a_cluster_or_a_number_of_stages() -> None:
    """Without a cluster, a number of stages is planned on free links with unlimited memory
    (as every other planner does), exactly as on a one-level cluster of free links."""
    bare = PlanRequest(profile=chain3(), num_microbatches=4, schedule="pipedream")
    with pytest.raises(PlannerError, match="needs a cluster, or a number of stages"):
        pipedream(bare)
    staged = pipedream(replace(bare, num_stages=2))
    free = pipedream(replace(bare, cluster=memory_only_cluster(2, None)))
    assert staged.plan.stages == free.plan.stages and staged.objective_ms == free.objective_ms


def test_straight_needs_a_stage_per_device() -> None:
    with pytest.raises(PlannerError, match=r"4 devices .* allows at most 3"):
        pipedream(request(chain3(), [4], [GBPS_10], single_replica=True))


def test_replicas_must_divide_the_microbatches() -> None:
    with pytest.raises(PlannerError, match=r"\[3\].*--microbatches 4.*e\.g\. 6"):
        pipedream(request(chain3(), [3], [GBPS_10], microbatches=4))


def test_too_many_antichain_states() -> None:
    graph = dp_graph(diamond())
    with pytest.raises(PlannerError, match="more than 3 antichain states"):
        antichain_dag(graph.succs, graph.preds, max_states=3)


# --- parity with PipeDream's optimizer --------------------------------------------------------


@cache
def profile_of(model: str) -> Profile:
    return import_pipedream(ROOT / "profiles" / "pipedream" / model / "graph.txt")


@cache
def costs_of(model: str) -> tuple[StateCosts, int]:
    profile = profile_of(model)
    graph = dp_graph(profile)
    dag = antichain_dag(graph.succs, graph.preds)
    return state_costs(profile, graph, dag), dag.num_states


def record_request(record: dict[str, Any]) -> PlanRequest:
    gbps: list[float | None] = [b * 8 / 1e9 for b in record["bandwidths_bytes_per_s"]]
    memory = record["memory_bytes"]
    return request(
        profile_of(record["model"]),
        record["levels"],
        gbps,
        single_replica=record["straight"],
        microbatches=MICROBATCHES,
        memory=None if memory is None else int(memory),
    )


def chain_cost_s(
    costs: StateCosts,
    levels: list[Level],
    splits: list[list[list[int]]],
    memory: float | None,
    comm: bool,
    lv: int,
    start: int,
    end: int,
) -> float:
    """The optimizer's time for the decoded stages of level ``lv`` within states [start, end):
    PipeDream's stage formulas applied stage by stage (no search)."""
    comp, act, par, out = (
        costs.compute_s,
        costs.activation_bytes,
        costs.parameter_bytes,
        costs.boundary_bytes,
    )
    machines, bandwidth = levels[lv].num_machines, levels[lv].bandwidth_bytes_per_s
    width = levels[lv - 1].num_machines if lv else 1
    stages = [s for s in splits[lv] if start <= s[0] and s[1] <= end]
    worst, used = -math.inf, 0
    for idx, (a, b, r) in enumerate(stages):
        used += r
        cum_par = par[b - 1] - (par[a - 1] if a else 0.0)
        cum_act = act[b - 1] - (act[a - 1] if a else 0.0)
        if memory is not None:
            assert (cum_act + cum_par) * math.ceil((machines - used) / r) <= memory
        compute = (
            comp[b - 1] - (comp[a - 1] if a else 0.0)
            if lv == 0
            else chain_cost_s(costs, levels, splits, memory, comm, lv - 1, a, b)
        )
        all_reduce = 4 * (r - 1) * cum_par / (bandwidth * r)
        time_s = (compute + all_reduce / (width if idx == 0 else 1)) / r
        if idx > 0 and comm:
            time_s = max(time_s, 2.0 * out[a - 1] / (bandwidth * r))
            if b < len(comp):
                time_s = max(time_s, 2.0 * out[b - 1] / (bandwidth * r))
        worst = max(worst, time_s)
    assert used == machines
    return worst


def record_id(record: dict[str, Any]) -> str:
    return str(record["id"])


@pytest.mark.parametrize("record", WITH_COMM, ids=record_id)
def test_parity_with_optimizer(record: dict[str, Any]) -> None:
    plan_request = record_request(record)
    if record["time_per_minibatch_s"] is None:
        with pytest.raises(InfeasibleError):
            pipedream(plan_request)
        return
    output = pipedream(plan_request)
    assert output.details["num_states"] == record["num_states"]
    assert math.isclose(output.objective_ms, record["time_per_minibatch_s"] * 1000, rel_tol=1e-9)
    resolve_plan(output.plan, plan_request.scaled)  # every layer in exactly one stage
    ours = [
        [per_level[0], per_level[1] if len(per_level) > 1 else None]
        for per_level in output.details["replicas_per_level"]
    ]
    dropped = output.details["empty_stages_dropped"]
    assert [stage.replicas for stage in output.plan.stages] == [
        math.prod(per_level)
        for idx, per_level in enumerate(output.details["replicas_per_level"])
        if idx not in dropped
    ]
    if ours not in record["replica_patterns"]:  # another plan as fast (see the docstring)
        costs, num_states = costs_of(record["model"])
        levels = [
            Level(n, b)
            for n, b in zip(record["levels"], record["bandwidths_bytes_per_s"], strict=True)
        ]
        top = len(levels) - 1
        cost = chain_cost_s(
            costs,
            levels,
            output.details["level_splits"],
            record["memory_bytes"],
            True,
            top,
            0,
            num_states,
        )
        assert math.isclose(cost, record["time_per_minibatch_s"], rel_tol=1e-9)


def test_irregular_and_empty_stages_as_in_pipedream() -> None:
    # GNMT, straight on 8 x 4 devices: PipeDream's inner level costs some stages across
    # branches (one at -17 ms in its own printout), and its optimum leaves stages without a
    # layer (24 or 25 of its 32 stages got layers in the recorded runs).
    record = next(r for r in WITH_COMM if r["id"] == "l/gnmt/8x4/straight")
    plan_request = record_request(record)
    output = pipedream(plan_request)
    assert math.isclose(output.objective_ms, record["time_per_minibatch_s"] * 1000, rel_tol=1e-9)
    assert output.details["irregular_stages"]
    dropped = output.details["empty_stages_dropped"]
    assert dropped
    assert len(output.plan.stages) == 32 - len(dropped)
    resolve_plan(output.plan, plan_request.scaled)


@pytest.mark.parametrize("record", WITHOUT_COMM, ids=record_id)
def test_dp_matches_optimizer_without_communication(record: dict[str, Any]) -> None:
    costs, num_states = costs_of(record["model"])
    assert num_states == record["num_states"]
    levels = [
        Level(n, b) for n, b in zip(record["levels"], record["bandwidths_bytes_per_s"], strict=True)
    ]
    solver = HierarchicalDP(
        costs,
        levels,
        memory_bytes=record["memory_bytes"],
        single_replica=record["straight"],
        activation_compression_ratio=None,
    )
    optimum = solver.optimum_s()
    assert optimum is not None
    assert math.isclose(optimum, record["time_per_minibatch_s"], rel_tol=1e-9)
    ours = [
        [span.replicas[0], span.replicas[1] if len(span.replicas) > 1 else None]
        for span in solver.stages()
    ]
    if ours not in record["replica_patterns"]:
        splits = [[list(split) for split in level] for level in solver.level_splits()]
        cost = chain_cost_s(
            costs, levels, splits, record["memory_bytes"], False, len(levels) - 1, 0, num_states
        )
        assert math.isclose(cost, optimum, rel_tol=1e-9)


# --- chains and the shortcuts that make long ones fast -----------------------------------------


def random_chain(rng: random.Random, num_layers: int) -> Profile:
    """A chain with some idle layers and some without parameters (sums that stay flat)."""
    layers = []
    for idx in range(num_layers):
        idle = rng.random() < 0.15
        layers.append(
            layer(
                f"n{idx}",
                0 if idle else rng.uniform(0.1, 5),
                0 if idle else rng.uniform(0.1, 8),
                output_bytes=rng.randrange(10**8),
                param_bytes=rng.choice([0, rng.randrange(10**9)]),
            )
        )
    return Profile.model_validate({"model": "chain", "microbatch_size": 1, "layers": layers})


def test_search_equals_the_full_tables_on_chains() -> None:
    # Memory sizes around what the first stages can stash, where the memory bounds and the
    # reach refusals (pipedream_bounds.py, pipedream_reach.py) do the pruning.
    rng = random.Random(11)
    solved = refused = 0
    for _ in range(120):
        profile = random_chain(rng, rng.randint(1, 14))
        graph = dp_graph(profile)
        costs = state_costs(profile, graph, antichain_dag(graph.succs, graph.preds))
        sizes = rng.choice([[2], [4], [8], [2, 2], [4, 2], [2, 4], [2, 2, 2]])
        levels = [Level(size, rng.choice([1e8, 1e9, 1e10, math.inf])) for size in sizes]
        held = costs.activation_bytes[-1] + costs.parameter_bytes[-1]
        memory = rng.choice([None, held * rng.uniform(0.05, 0.8)])
        straight, ratio = rng.random() < 0.25, rng.choice([None, 1.0])
        expected = naive_optimum(costs, levels, memory, straight, ratio)
        solver = HierarchicalDP(
            costs,
            levels,
            memory_bytes=memory,
            single_replica=straight,
            activation_compression_ratio=ratio,
        )
        optimum = solver.optimum_s()
        if math.isinf(expected):
            assert optimum is None
            refused += 1
            continue
        solved += 1
        assert optimum is not None
        assert math.isclose(optimum, expected, rel_tol=1e-9, abs_tol=1e-15)
        splits = [[list(split) for split in level] for level in solver.level_splits()]
        cost = chain_cost_s(
            costs,
            levels,
            splits,
            memory,
            ratio is not None,
            len(levels) - 1,
            0,
            len(costs.compute_s),
        )
        assert math.isclose(cost, optimum, rel_tol=1e-9, abs_tol=1e-15)
    assert solved >= 60 and refused >= 10


def layer_by_layer_costs(profile: Profile, down_sets: tuple[int, ...]) -> list[list[float]]:
    """C, A and P of each down-set added up layer by layer in ascending order, as OGH does."""
    graph = dp_graph(profile)
    sums = []
    for down in down_sets:
        time_s = act = par = 0.0
        for node in bits(down):
            profile_layer = profile.layers[graph.layers[node]]
            time_s += (profile_layer.fwd_ms + profile_layer.bwd_ms) / 1000.0
            act += profile_layer.output_bytes
            par += profile_layer.param_bytes
        sums.append([time_s, act, par])
    return sums


def full_cone_augment(self: Any, antichain: list[int]) -> list[int]:
    """``augment_antichain`` testing every ancestor of every member, not only branching ones."""
    extra = 0
    for member in antichain:
        cone = self.anc[member]
        outside = ~(cone | (1 << member))
        for pred in bits(cone):
            if self.succ_mask[pred] & outside:
                extra |= 1 << pred
    return [*bits(extra), *antichain]


def shortcut_profiles() -> list[Profile]:
    rng = random.Random(5)
    models = [
        "alexnet",
        "vgg16",
        "resnet18",
        "resnet50",
        "resnet101",
        "resnext101",
        "densenet121",
        "squeezenet1_0",
        "gnmt",
        "gnmt_large",
    ]
    return (
        [profile_of(model) for model in models]
        + [random_graph(rng) for _ in range(40)]
        + [random_chain(rng, rng.randint(1, 300)) for _ in range(10)]
    )


def test_antichain_states_equal_the_full_cone_enumeration(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a layer feeding two or more layers is scanned when augmenting (antichains.py).
    graphs = [dp_graph(profile) for profile in shortcut_profiles()]
    fast = [antichain_dag(graph.succs, graph.preds) for graph in graphs]
    monkeypatch.setattr(
        "pipestudio.planner.algorithms.pipedream.antichains._Enumerator.augment", full_cone_augment
    )
    assert fast == [antichain_dag(graph.succs, graph.preds) for graph in graphs]


def test_state_costs_equal_layer_by_layer_sums() -> None:
    # Bit for bit: the prefix sums of state_costs perform the same additions in the same order.
    for profile in [*shortcut_profiles(), block_chain(500)]:
        graph = dp_graph(profile)
        dag = antichain_dag(graph.succs, graph.preds)
        costs = state_costs(profile, graph, dag)
        ours = [
            list(row)
            for row in zip(
                costs.compute_s, costs.activation_bytes, costs.parameter_bytes, strict=True
            )
        ]
        assert ours == layer_by_layer_costs(profile, dag.down_sets)


@pytest.mark.parametrize("num_layers", [2000, 4000])
def test_long_chain_is_planned_with_the_fast_paths(num_layers: int) -> None:
    # bench/bench_planners.py's configuration: one state per layer, a memory that binds on the
    # first stages (and with 4,000 layers on the first top-level stage, which holds at most
    # the memory); the plan costs its optimum under PipeDream's model, stage by stage.
    profile = block_chain(num_layers)
    cluster = cluster_template(
        [8, 2], [400.0, 100.0], device_memory_bytes=40 * 2**30, host_bandwidth_gbps=200.0
    )
    plan_request = PlanRequest(
        profile=profile, num_microbatches=32, schedule="1f1b", cluster=cluster
    )
    output = pipedream(plan_request)
    assert output.details["num_states"] == profile.num_layers
    resolve_plan(output.plan, plan_request.scaled)
    graph = dp_graph(plan_request.scaled)
    costs = state_costs(plan_request.scaled, graph, antichain_dag(graph.succs, graph.preds))
    levels = [Level(8, 400e9 / 8), Level(2, 100e9 / 8)]
    cost = chain_cost_s(
        costs, levels, output.details["level_splits"], 40 * 2**30, True, 1, 0, profile.num_layers
    )
    assert math.isclose(cost, output.details["time_per_minibatch_s"], rel_tol=1e-12)


def test_a_chain_has_one_state_per_layer_however_long() -> None:
    num_layers = MAX_STATES + 100
    succs = [(node + 1,) for node in range(num_layers - 1)] + [()]
    preds = [()] + [(node,) for node in range(num_layers - 1)]
    dag = antichain_dag(succs, preds)
    assert dag.num_states == num_layers
    assert dag.successors[:3] == ((1,), (2,), (3,))
    assert dag.ancestors[4] == 0b1111


def test_nasnet_has_too_many_antichain_states() -> None:
    # Its cells' parallel branches give far more antichains than any DP can visit; PipeDream
    # needs its graph compressed first. We say so instead of running out of memory.
    plan_request = request(profile_of("nasnetamobile"), [4, 2], [100.0, 10.0])
    with pytest.raises(PlannerError, match=r"of 920 layers has more than 5920 antichain states"):
        pipedream(plan_request)


def test_ties_keep_the_one_stage_plan() -> None:
    # Two 10 ms layers on 2 servers of 2 devices, free links: every plan takes 5 ms. The
    # optimizer keeps a split only when strictly faster than the one stage tried first, at
    # each level; so: one stage on all 4 devices.
    profile = Profile.model_validate(
        {"model": "twins", "microbatch_size": 1, "layers": [layer("a", 4, 6), layer("b", 4, 6)]}
    )
    output = pipedream(request(profile, [2, 2], [None, None]))
    assert output.objective_ms == pytest.approx(5.0, rel=1e-12)
    assert shape(output) == [(["a", "b"], 4)]
    assert output.details["replicas_per_level"] == [[2, 2]]


class PlainSearch(HierarchicalDP):
    """The branch and bound without its shortcuts for memory and long chains: no reach
    refusals, no memory stops or skips in the scan, no memo shortcut. It scans the same
    candidates in the same order, so it must give the same optimum and the same splits."""

    def __init__(self, costs: StateCosts, levels: list[Level], **options: Any) -> None:
        super().__init__(costs, levels, **options)
        self.bounds.reach = None
        self.bounds.memory_bytes = None  # the bounds' memory tests; the DP keeps its own

    def _known_not_below(
        self, lv: int, row: int, col: int, m: int, best: float, limit: float
    ) -> bool:
        return False


def assert_same_answer(costs: StateCosts, levels: list[Level], **options: Any) -> bool:
    fast = HierarchicalDP(costs, levels, **options)
    plain = PlainSearch(costs, levels, **options)
    optimum = fast.optimum_s()
    assert optimum == plain.optimum_s()  # bit for bit
    if optimum is None:
        return False
    assert fast.level_splits() == plain.level_splits()
    return True


def test_shortcuts_change_no_answer_on_chains() -> None:
    rng = random.Random(21)
    solved = 0
    for _ in range(40):
        profile = random_chain(rng, rng.randint(20, 120))
        graph = dp_graph(profile)
        costs = state_costs(profile, graph, antichain_dag(graph.succs, graph.preds))
        sizes = rng.choice([[8, 2], [4, 2], [16], [8], [2, 2, 2], [4, 4]])
        levels = [Level(size, rng.choice([1e8, 1e9, 1e10, math.inf])) for size in sizes]
        held = costs.activation_bytes[-1] + costs.parameter_bytes[-1]
        memory = rng.choice([None, held * rng.uniform(0.05, 0.8)])
        solved += assert_same_answer(
            costs,
            levels,
            memory_bytes=memory,
            single_replica=rng.random() < 0.25,
            activation_compression_ratio=rng.choice([None, 1.0]),
        )
    assert solved >= 20


@pytest.mark.parametrize("model", ["resnet50", "resnet101", "densenet121", "gnmt"])
def test_shortcuts_change_no_answer_on_real_graphs(model: str) -> None:
    costs, _ = costs_of(model)
    held = costs.activation_bytes[-1] + costs.parameter_bytes[-1]
    for sizes, memory in (
        ([8, 2], None),
        ([8, 2], held * 0.3),
        ([4, 4], held * 0.1),
        ([16], held * 0.1),
    ):
        levels = [
            Level(size, bandwidth)
            for size, bandwidth in zip(sizes, [1.25e10, 1.25e9][: len(sizes)], strict=True)
        ]
        assert_same_answer(costs, levels, memory_bytes=memory)


def test_shortcuts_change_no_answer_on_a_memory_bound_chain() -> None:
    # Like bench/bench_planners.py's chain at 4,000 layers (the memory binds on the first
    # stages of both levels), scaled down so that the plain search stays quick.
    profile = block_chain(400)
    graph = dp_graph(profile)
    costs = state_costs(profile, graph, antichain_dag(graph.succs, graph.preds))
    levels = [Level(8, 400e9 / 8), Level(2, 100e9 / 8)]
    assert assert_same_answer(costs, levels, memory_bytes=40 * 2**30 / 10)
