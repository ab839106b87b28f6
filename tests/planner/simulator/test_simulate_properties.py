"""Properties of the simulator on random profiles, plans and clusters (hypothesis)."""

import math
from collections import defaultdict
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipestudio.planner import Cluster, Plan, Profile, SimResult, cluster_template, simulate
from pipestudio.planner.formats.result import COMPUTE_OPS
from tests.planner.strategies import profiles

EPS = 1e-6


@st.composite
def cases(draw: st.DrawFn) -> tuple[Profile, Plan, Cluster | None]:
    # real times, not 1e-308 ms
    times = st.one_of(st.just(0.0), st.floats(1e-6, 10))
    profile = draw(profiles(max_layers=12, times=times, max_extra_edges=6))
    num_layers = len(profile.layers)
    num_stages = draw(st.integers(1, min(4, num_layers)))
    cuts = (
        sorted(
            draw(
                st.sets(
                    st.integers(1, num_layers - 1), min_size=num_stages - 1, max_size=num_stages - 1
                )
            )
        )
        if num_stages > 1
        else []
    )
    bounds = [0, *cuts, num_layers]
    replicas = [draw(st.sampled_from([1, 1, 2])) for _ in range(num_stages)]
    num_mb = draw(st.integers(1, 6)) * (2 if 2 in replicas else 1)
    names = [layer.name for layer in profile.layers]
    plan = Plan.model_validate(
        {
            "model": "random",
            "schedule": draw(st.sampled_from(["gpipe", "1f1b", "pipedream"])),
            "num_microbatches": num_mb,
            "microbatch_size": draw(st.sampled_from([1, 2, 3])),
            "optimizer": draw(st.sampled_from(["sgd", "momentum", "adam"])),
            "stages": [
                {"layers": names[a:b], "replicas": r}
                for a, b, r in zip(bounds, bounds[1:], replicas, strict=False)
            ],
            "policies": {
                name: draw(st.sampled_from(["keep", "recompute", "swap"])) for name in names
            },
        }
    )
    cluster = None
    if draw(st.booleans()):
        inner = draw(st.integers(1, 4))
        outer = -(-sum(replicas) // inner)
        cluster = cluster_template(
            [inner, outer],
            [draw(st.floats(0.5, 400)), draw(st.floats(0.5, 400))],
            device_memory_bytes=draw(st.one_of(st.none(), st.integers(10**5, 10**8))),
            host_bandwidth_gbps=draw(st.one_of(st.none(), st.floats(0.1, 100))),
        )
    return profile, plan, cluster


def _work_per_step(profile: Profile, plan: Plan, stage_idx: int) -> float:
    """Compute time a replica of a stage must spend per step, from the profile alone."""
    scaled = profile.rescaled(plan.microbatch_size)
    layers = {layer.name: layer for layer in scaled.layers}
    stage = plan.stages[stage_idx]
    per_mb = sum(
        layers[n].fwd_ms
        + layers[n].bwd_ms
        + (layers[n].fwd_ms if plan.policy(n) == "recompute" else 0.0)
        for n in stage.layers
    )
    update = sum(layers[n].update_ms for n in stage.layers)
    mbs = plan.num_microbatches // stage.replicas
    updates = mbs if plan.schedule == "pipedream" else 1
    return mbs * per_mb + updates * update


def _check_dependencies(result: SimResult) -> None:
    """Every op starts after what it needs. For pipedream the timeline holds only the
    measured window, so a pair is checked when both of its ops are in it."""
    complete = result.schedule != "pipedream"
    ops: dict[tuple[str, int, int | None], tuple[float, float]] = {}
    for op in result.timeline:
        if op.op in ("forward", "backward", "recompute", "swap_out", "swap_in"):
            ops[(op.op, op.stage, op.microbatch)] = (op.start_ms, op.end_ms)

    def after(later: tuple[float, float] | None, key: tuple[str, int, int | None]) -> None:
        earlier = ops.get(key)
        if earlier is None or later is None:
            assert not complete or key[0] in ("recompute", "swap_in"), key
            return
        assert later[0] >= earlier[1] - EPS, (key, earlier, later)

    for (kind, stage, mb), span in ops.items():
        assert span[0] <= span[1]
        if kind == "backward":
            for needed in ("forward", "recompute", "swap_in"):
                after(span, (needed, stage, mb))
        elif kind == "swap_in":
            after(span, ("swap_out", stage, mb))
        elif kind == "swap_out":
            after(span, ("forward", stage, mb))

    def before(span: tuple[float, float], key: tuple[str, int, int | None]) -> None:
        later = ops.get(key)
        if later is None:
            assert not complete, key
            return
        assert later[0] >= span[1] - EPS, (key, span, later)

    for op in result.timeline:
        peer = op.peer_stage if op.peer_stage is not None else -1
        span = (op.start_ms, op.end_ms)
        if op.op == "send_activation":
            after(span, ("forward", op.stage, op.microbatch))
            before(span, ("forward", peer, op.microbatch))
        elif op.op == "send_gradient":
            after(span, ("backward", op.stage, op.microbatch))
            has_recompute = ("recompute", peer, op.microbatch) in ops
            before(span, ("recompute" if has_recompute else "backward", peer, op.microbatch))


def _check_no_overlap(result: SimResult) -> None:
    device = {(s.index, r): d for s in result.stages for r, d in enumerate(s.devices)}
    busy: dict[tuple[object, ...], list[tuple[float, float]]] = defaultdict(list)
    for op in result.timeline:
        if op.end_ms == op.start_ms:
            continue
        here = device[(op.stage, op.replica)]
        if op.op in COMPUTE_OPS:
            busy[("compute", here)].append((op.start_ms, op.end_ms))
        elif op.op.startswith("send_"):
            there = device[(op.peer_stage or 0, op.peer_replica or 0)]
            busy[("link", here, there)].append((op.start_ms, op.end_ms))
        elif op.op.startswith("swap_"):
            busy[(op.op, here)].append((op.start_ms, op.end_ms))
    for intervals in busy.values():
        intervals.sort()
        for (_, end), (start, _) in pairwise(intervals):
            assert start >= end - EPS


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_simulation_properties(case: tuple[Profile, Plan, Cluster | None]) -> None:
    profile, plan, cluster = case
    result = simulate(profile, plan, cluster)

    placed = [name for stage in result.stages for name in stage.layers]
    assert sorted(placed) == sorted(layer.name for layer in profile.layers)
    assert len(placed) == len(set(placed))

    busiest = max(_work_per_step(profile, plan, idx) for idx in range(plan.num_stages))
    if plan.schedule != "pipedream":
        # pipedream never flushes: its measured step is a window of a stream whose ops for
        # that step may have started before it, so one step can be shorter than a stage's
        # work per step (only the mean of many steps is bound by it)
        assert result.step_time_ms >= busiest - EPS * max(1.0, busiest)
    assert 0.0 <= result.bubble_fraction <= 1.0
    if busiest > 0:  # some compute: some of the step is busy
        assert result.bubble_fraction < 1.0
        stage_busy = sum(stage.busy_ms for stage in result.stages)
        assert math.isclose(
            result.bubble_fraction,
            1 - stage_busy / (plan.num_stages * result.step_time_ms),
            rel_tol=1e-9,
            abs_tol=1e-12,
        )
    assert (
        math.isclose(
            result.samples_per_s * result.step_time_ms,
            plan.num_microbatches * plan.microbatch_size * 1e3,
            rel_tol=1e-9,
        )
        or result.step_time_ms == 0
    )

    _check_dependencies(result)
    _check_no_overlap(result)

    for track in result.memory_timeline:
        assert min(track.bytes) >= 0
        stage = result.stages[track.stage]
        static = (
            stage.memory.weights_bytes + stage.memory.gradients_bytes + stage.memory.optimizer_bytes
        )
        assert min(track.bytes) >= static
        assert max(track.bytes) <= stage.peak_bytes
    for stage in result.stages:
        tracks = [t for t in result.memory_timeline if t.stage == stage.index]
        if result.schedule == "pipedream":  # tracks cover only the measured window
            assert stage.peak_bytes >= max(max(t.bytes) for t in tracks)
        else:
            assert stage.peak_bytes == max(max(t.bytes) for t in tracks)
        assert stage.peak_bytes == stage.memory.total_bytes
        shared = len({d for s in result.stages for d in s.devices}) < sum(
            s.replicas for s in result.stages
        )
        if stage.device_memory_bytes is not None and not shared:
            assert stage.fits == (stage.peak_bytes <= stage.device_memory_bytes)
    assert result.fits == all(stage.fits for stage in result.stages)
