"""The simulator's work budget (``simulator/budget.py``): the op count it predicts, and the requests
it refuses before any work, in ``simulate`` and in ``run_planner``."""

import random
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings

from pipestudio.planner import Cluster, Plan, PlanError, Profile, cluster_template, simulate
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms import request as request_module
from pipestudio.planner.algorithms.request import (
    PlannerOutput,
    PlanRequest,
    check_request_budget,
    run_planner,
)
from pipestudio.planner.errors import WorkBudgetError
from pipestudio.planner.formats.pipedream import import_pipedream
from pipestudio.planner.formats.plan import resolve_plan
from pipestudio.planner.simulator.budget import DEFAULT_MAX_SIMULATED_OPS, Workload, plan_workload
from pipestudio.planner.simulator.events import OpGraph
from tests.conftest import PIPEDREAM_DIR
from tests.planner.helpers import chain_profile, even_plan, single_level_cluster
from tests.planner.simulator.test_simulate_properties import cases


@contextmanager
def counting_ops() -> Iterator[list[int]]:
    """The number of ops of every op graph the simulator runs meanwhile."""
    counts: list[int] = []
    run = OpGraph.run

    def counted(graph: OpGraph) -> object:
        counts.append(len(graph.duration))
        return run(graph)

    with mock.patch.object(OpGraph, "run", counted):
        yield counts


def workload(profile: Profile, plan: Plan, num_steps: int = 1) -> Workload:
    return plan_workload(profile, plan, resolve_plan(plan, profile), num_steps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_count_is_what_the_simulator_builds(case: tuple[Profile, Plan, Cluster | None]) -> None:
    """Exact when every layer is kept; otherwise an upper bound (a swap right before its
    own backward, or a recompute or swap of nothing, builds no op)."""
    profile, plan, cluster = case
    with counting_ops() as counts:
        simulate(profile, plan, cluster, num_steps=2, with_timeline=False)
    expected = workload(profile, plan, 2).num_ops()
    if set(plan.policies.values()) <= {"keep"}:
        assert counts == [expected]
    else:
        assert len(counts) == 1 and counts[0] <= expected


def test_a_million_microbatches_are_refused_at_once() -> None:
    profile = chain_profile(8)
    # The Plan document allows 100,000 micro-batches; a plan built in code may hold more.
    plan = even_plan(profile, 4, 8, "1f1b").model_copy(update={"num_microbatches": 10**6})
    with counting_ops() as counts, pytest.raises(WorkBudgetError) as info:
        simulate(profile, plan, num_steps=2, max_ops=2_000_000)
    assert counts == []  # refused from the plan's shape, before any graph is built
    assert str(info.value) == (
        "num_microbatches=1000000: simulating 2 steps of 1000000 micro-batches on 4 workers "
        "is 28000000 operations, more than the limit of 2000000; use fewer micro-batches or "
        "steps"
    )
    assert (info.value.field, info.value.limit, info.value.num_ops) == (
        "num_microbatches",
        2_000_000,
        28_000_000,
    )


def test_the_largest_valid_plan_is_refused_by_the_default_budget() -> None:
    profile = chain_profile(8)
    plan = even_plan(profile, 4, 100_000, "gpipe")
    with (
        counting_ops() as counts,
        pytest.raises(WorkBudgetError, match=f"the limit of {DEFAULT_MAX_SIMULATED_OPS}"),
    ):
        simulate(profile, plan, max_ops=DEFAULT_MAX_SIMULATED_OPS)
    assert counts == []


def test_a_plan_at_the_limit_runs_and_one_op_more_is_refused() -> None:
    profile = chain_profile(8)
    plan = even_plan(profile, 4, 64, "pipedream")
    num_ops = workload(profile, plan, 2).num_ops()
    with counting_ops() as counts:
        simulate(profile, plan, num_steps=2, max_ops=num_ops)
    assert counts == [num_ops]
    with pytest.raises(WorkBudgetError, match=f"more than the limit of {num_ops - 1};"):
        simulate(profile, plan, num_steps=2, max_ops=num_ops - 1)
    simulate(profile, plan, num_steps=2, max_ops=None)


@pytest.mark.parametrize(
    ("num_stages", "num_microbatches", "num_steps", "field"),
    [
        (4, 1000, 2, "num_microbatches"),
        (4, 4, 100_000, "num_steps"),
        (400, 1, 1, "stages"),
    ],
)
def test_the_error_names_the_field_that_multiplies_the_work_most(
    num_stages: int, num_microbatches: int, num_steps: int, field: str
) -> None:
    profile = chain_profile(400)
    plan = even_plan(profile, num_stages, num_microbatches, "gpipe")
    with pytest.raises(WorkBudgetError) as info:
        simulate(profile, plan, num_steps=num_steps, max_ops=1000)
    assert info.value.field == field and info.value.limit == 1000
    assert str(info.value).startswith(f"{field}=")


def test_pipedream_counts_its_warm_up_and_drain_steps() -> None:
    profile = chain_profile(8)
    plan = even_plan(profile, 8, 2, "pipedream")
    with pytest.raises(
        WorkBudgetError, match=r"simulating 1 step \(and 9 warm-up and drain steps\) of 2 "
    ):
        simulate(profile, plan, max_ops=10)


def shared_device_plan(num_workers: int) -> Plan:
    """One stage on ``num_workers`` replicas, two on each device."""
    profile = chain_profile(2)
    plan = even_plan(profile, 1, num_workers, "gpipe")
    return plan.model_copy(
        update={
            "stages": [
                plan.stages[0].model_copy(
                    update={
                        "replicas": num_workers,
                        "devices": [idx // 2 for idx in range(num_workers)],
                    }
                )
            ]
        }
    )


def test_devices_shared_by_thousands_of_workers_count_their_memory_checks() -> None:
    plan = shared_device_plan(4000)
    profile = chain_profile(2)
    with_memory = single_level_cluster(2000, memory=2**40)
    assert workload(profile, plan).num_ops() == 3 * 4000 + 1
    with pytest.raises(WorkBudgetError) as info:
        simulate(profile, plan, with_memory, max_ops=20_000)
    assert info.value.field == "stages.devices"
    assert str(info.value).startswith("stages.devices=2000: ")
    simulate(profile, plan, single_level_cluster(2000), max_ops=20_000, with_timeline=False)


def test_the_slowest_link_among_replicas_is_found_without_pairing_them() -> None:
    rng = random.Random(7)
    for _ in range(300):
        sizes = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
        cluster = cluster_template(sizes, [rng.choice([None, 0.5, 5.0, 50.0]) for _ in sizes])
        devices = [rng.randrange(cluster.num_devices) for _ in range(rng.randint(1, 6))]
        pairwise = [
            bandwidth
            for a in devices
            for b in devices
            if (bandwidth := cluster.bandwidth_gbps(a, b)) is not None
        ]
        assert cluster.slowest_bandwidth_gbps(devices) == min(pairwise, default=None)


# --- requests: refused before any planner runs ---------------------------------------------


def never_called(request: PlanRequest) -> PlannerOutput:
    raise AssertionError("the planner ran")


def test_a_request_over_the_budget_is_refused_before_the_planner_runs() -> None:
    request = PlanRequest(
        profile=chain_profile(64), num_microbatches=100_000, schedule="1f1b", num_stages=4
    )
    with counting_ops() as counts, pytest.raises(WorkBudgetError) as info:
        run_planner("uniform", never_called, request, max_ops=DEFAULT_MAX_SIMULATED_OPS)
    assert counts == []
    assert info.value.field == "num_microbatches"
    assert info.value.limit == DEFAULT_MAX_SIMULATED_OPS
    assert "num_microbatches=100000: simulating 1 step of 100000 micro-batches on 4 workers" in str(
        info.value
    )


def test_a_request_counts_every_device_of_its_cluster() -> None:
    request = PlanRequest(
        profile=chain_profile(4000),
        num_microbatches=64,
        schedule="pipedream",
        num_stages=2,
        cluster=cluster_template([1000, 4], [100.0, 10.0]),
    )
    with pytest.raises(WorkBudgetError) as info:
        check_request_budget(request, DEFAULT_MAX_SIMULATED_OPS)
    assert info.value.field == "cluster.devices"
    assert str(info.value).startswith("cluster.devices=4000: ")


def test_the_request_bound_holds_for_what_the_planners_return() -> None:
    chain = chain_profile(12, update_ms=0.1)
    graph = import_pipedream(PIPEDREAM_DIR / "resnet18" / "graph.txt", batch_size=32)
    for profile in (chain, graph):
        for algorithm in ("uniform", "balance-time", "optimal", "pipedream"):
            request = PlanRequest(
                profile=profile,
                num_microbatches=12,
                schedule="pipedream",
                num_stages=4,
                cluster=single_level_cluster(4, memory=2**40, host_gbps=10.0),
            )
            bound = workload_of_request(request)
            with counting_ops() as counts:
                outcome = run_planner(algorithm, PLANNERS[algorithm], request, max_ops=bound)
            assert outcome.plan is not None, outcome.error
            assert max(counts) <= bound  # the final simulation and any the planner ran
            with pytest.raises(WorkBudgetError):
                run_planner(algorithm, never_called, request, max_ops=bound - 1)


def workload_of_request(request: PlanRequest) -> int:
    """The bound ``check_request_budget`` compares with its limit."""
    try:
        check_request_budget(request, 0)
    except WorkBudgetError as exc:
        return exc.num_ops
    raise AssertionError("a limit of 0 ops refuses every request")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_microbatches": 100_001}, "--microbatches must be <= 100000 (a plan's limit), got"),
        ({"microbatch_size": 2**24 + 1}, "--microbatch-size must be <= 16777216"),
    ],
)
def test_requests_past_the_plan_limits_are_refused(changes: dict[str, int], message: str) -> None:
    fields: dict[str, object] = {"num_microbatches": 8, **changes}
    with pytest.raises(PlanError, match=re.escape(message)):
        PlanRequest(profile=chain_profile(4), schedule="gpipe", **fields)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_simulation_at_the_default_limit_takes_seconds_not_minutes() -> None:
    profile = chain_profile(16)
    plan = even_plan(profile, 4, 5356, "1f1b")  # 2 steps x 5356 x 14 = 149,968 ops
    assert workload(profile, plan, 2).num_ops() <= DEFAULT_MAX_SIMULATED_OPS
    started = time.perf_counter()
    result = simulate(profile, plan, num_steps=2, max_ops=DEFAULT_MAX_SIMULATED_OPS)
    assert time.perf_counter() - started < 10
    assert len(result.timeline) == workload(profile, plan, 2).num_ops()


@pytest.mark.parametrize(
    ("num_layers", "num_stages", "words"),
    [
        (100, 65, "at most 64 workers"),
        (20_000, 64, "1280000 layer-worker pairs, more than the limit of 1000000"),
    ],
)
def test_a_planners_own_search_is_bounded(
    num_layers: int, num_stages: int, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planners whose work grows with layers x workers (and pipedream's and vpipe's with
    the workers squared) are not started on more than the budget allows, and the refusal
    comes before any work: no planner runs and no simulation bound is built."""
    request = PlanRequest(
        profile=chain_profile(num_layers),
        num_microbatches=4,
        schedule="1f1b",
        num_stages=num_stages,
    )

    def no_work(*_args: object, **_kwargs: object) -> NoReturn:
        raise AssertionError("work was done before the request was refused")

    monkeypatch.setattr(request_module, "most_boundaries", no_work)
    with pytest.raises(WorkBudgetError) as info:
        run_planner("vpipe", no_work, request, max_ops=DEFAULT_MAX_SIMULATED_OPS)
    assert info.value.field == "num_stages" and words in str(info.value)
    check_request_budget(request, None)  # no budget (the command line): no limit


def test_a_request_at_the_search_limit_plans_within_seconds() -> None:
    request = PlanRequest(
        profile=chain_profile(15_600), num_microbatches=4, schedule="1f1b", num_stages=64
    )
    for algorithm in ("optimal", "vpipe", "dawnpiper"):
        started = time.perf_counter()
        outcome = run_planner(
            algorithm,
            PLANNERS[algorithm],
            request,
            max_ops=DEFAULT_MAX_SIMULATED_OPS,
            with_timeline=False,
        )
        assert outcome.plan is not None, outcome.error
        assert time.perf_counter() - started < 10, algorithm
