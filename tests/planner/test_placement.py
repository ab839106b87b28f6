"""Ranks that share a host's cores placed on its compute slots (``planner/placement.py``)."""

from pipestudio.planner import Profile, cluster_template, plan_template, simulate
from pipestudio.planner.placement import Host, shared_placement


def profile() -> Profile:
    return Profile.model_validate({"model": "m", "microbatch_size": 1, "layers": [
        {"name": f"l{i}", "fwd_ms": 1.0, "bwd_ms": 2.0, "output_bytes": 1000}
        for i in range(8)]})


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
    placed = shared_placement(plan, None, [Host("a", 2, 1), Host("b", 4, 2)],
                              [[0], [0], [0], [1]])
    assert placed is not None
    assert [stage.devices for stage in placed[0].stages] == [[0], [1], [0], [2]]
