"""Ranks that share a host's cores placed on its compute slots
(``planner/simulator/placement.py``)."""

from pipestudio.planner import Profile, cluster_template, plan_template, simulate
from pipestudio.planner.simulator.placement import Host, shared_placement, started_hosts


def profile() -> Profile:
    return Profile.model_validate(
        {
            "model": "m",
            "microbatch_size": 1,
            "layers": [
                {"name": f"l{i}", "fwd_ms": 1.0, "bwd_ms": 2.0, "output_bytes": 1000}
                for i in range(8)
            ],
        }
    )


def test_more_ranks_than_cores_share_them_round_robin() -> None:
    plan = plan_template(profile(), 4, 8, "1f1b")
    cluster = cluster_template([4], [10.0])
    placed = shared_placement(plan, cluster, [Host("h", cores=2, threads=1)], [[0]] * 4)
    assert placed is not None
    shared_plan, shared = placed
    assert [stage.devices for stage in shared_plan.stages] == [[0], [1], [0], [1]]
    assert shared.num_devices == 2 and shared.levels[0].bandwidth_gbps == 10.0
    # two stages on one slot compute one op at a time: slower than a device each
    alone = simulate(profile(), plan, cluster, with_timeline=False).step_time_ms
    together = simulate(profile(), shared_plan, shared, with_timeline=False).step_time_ms
    assert together > 1.5 * alone


def test_a_core_per_rank_changes_nothing() -> None:
    plan = plan_template(profile(), 4, 8, "1f1b")
    hosts = [Host("a", cores=2, threads=1), Host("b", cores=4, threads=2)]
    assert shared_placement(plan, None, hosts, [[0], [0], [1], [1]]) is None
    # four threads' worth of ranks on b's four cores, two at a time on a's two
    placed = shared_placement(plan, None, [Host("a", 2, 1), Host("b", 4, 2)], [[0], [0], [0], [1]])
    assert placed is not None
    assert [stage.devices for stage in placed[0].stages] == [[0], [1], [0], [2]]


def _start(
    stage: int, host: str, device: str, *, cores: int | None = 8, threads: int = 4, attempt: int = 0
) -> dict[str, object]:
    return {
        "type": "start",
        "rank": stage,
        "stage": stage,
        "replica": 0,
        "host": host,
        "device": device,
        "cores": cores,
        "threads": threads,
        "attempt": attempt,
    }


def test_ranks_on_one_gpu_share_it_with_its_memory_and_host_links() -> None:
    """Two of three stages ran on cuda:0 of one host (its start events say so): they
    take turns on one device that keeps the cluster's memory and host links, over which
    their exchanges are staged; the third ran on cuda:1."""
    plan = plan_template(profile(), 3, 4, "1f1b")
    cluster = cluster_template([3], [100.0], device_memory_bytes=10**9, host_bandwidth_gbps=0.008)
    events = [_start(0, "a", "cuda:0"), _start(1, "a", "cuda:0"), _start(2, "a", "cuda:1")]
    found = started_hosts(plan, events)
    assert found is not None
    hosts, host_of = found
    assert [h.gpu for h in hosts] == [True, True] and host_of == [[0], [0], [1]]
    placed = shared_placement(plan, cluster, hosts, host_of)
    assert placed is not None
    shared_plan, shared = placed
    assert [stage.devices for stage in shared_plan.stages] == [[0], [0], [1]]
    assert [d.memory_bytes for d in shared.devices] == [10**9, 10**9]
    assert shared.devices[0].device_to_host_gbps == 0.008
    result = simulate(profile(), shared_plan, shared)
    # 1000 bytes over 8 Mbit/s out and back: 2 ms per exchange between stages 0 and 1
    sends = [op for op in result.timeline or [] if op.op == "send_activation" and op.stage == 0]
    assert sends and all(abs(op.end_ms - op.start_ms - 2.0) < 1e-9 for op in sends)
    alone = simulate(profile(), plan, cluster).step_time_ms
    assert result.step_time_ms > 1.3 * alone


def test_start_events_place_cpu_ranks_by_their_hosts_cores() -> None:
    plan = plan_template(profile(), 4, 8, "1f1b")
    # an earlier attempt on other hosts is not the run's placement
    events = [_start(s, "old", "cpu", attempt=0) for s in range(4)]
    events += [_start(s, "h", "cpu", cores=2, threads=1, attempt=1) for s in range(4)]
    found = started_hosts(plan, events)
    assert found == ([Host("h", 2, 1)], [[0], [0], [0], [0]])
    placed = shared_placement(plan, None, *found)
    assert placed is not None
    assert [stage.devices for stage in placed[0].stages] == [[0], [1], [0], [1]]
    # a stage without a start event, or a CPU rank that does not say its cores: unknown
    assert started_hosts(plan, events[:-1]) is None
    assert started_hosts(plan, [_start(s, "h", "cpu", cores=None) for s in range(4)]) is None
    assert started_hosts(plan, [_start(s, "h", "cpu", cores=8, threads=2) for s in range(4)]) == (
        [Host("h", 8, 2)],
        [[0]] * 4,
    )
