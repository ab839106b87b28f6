"""The simulator against closed forms (uniform layers; free links unless stated)."""

import math

import pytest

from pipestudio.planner import Cluster, simulate
from pipestudio.planner.simulator.peaks import peak_tflops
from pipestudio.planner.units import gbps_to_bytes_per_ms
from tests.planner.helpers import chain_profile, even_plan, single_level_cluster

REL = 1e-9
TF, TB = 1.25, 2.5  # per stage: two layers of 0.625 / 1.25 ms
SAVED = 2 * 1000  # per stage and micro-batch


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=REL, abs_tol=1e-12)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_sync_step_time_and_bubble_closed_forms(schedule: str) -> None:
    for num_stages in range(1, 9):
        profile = chain_profile(2 * num_stages, fwd_ms=TF / 2, bwd_ms=TB / 2)
        for num_mb in range(1, 65):
            result = simulate(
                profile, even_plan(profile, num_stages, num_mb, schedule), with_timeline=False
            )
            expected = (num_mb + num_stages - 1) * (TF + TB)
            assert close(result.step_time_ms, expected), (num_stages, num_mb)
            bubble = (num_stages - 1) / (num_mb + num_stages - 1)
            assert close(result.bubble_fraction, bubble), (num_stages, num_mb)
            assert close(result.samples_per_s, num_mb * 4 / expected * 1e3)


def test_in_flight_activations_1f1b_and_gpipe() -> None:
    for num_stages in range(1, 9):
        profile = chain_profile(2 * num_stages)
        for num_mb in range(1, 65):
            for schedule in ("1f1b", "gpipe"):
                result = simulate(
                    profile, even_plan(profile, num_stages, num_mb, schedule), with_timeline=False
                )
                for stage in result.stages:
                    kept = min(num_stages - stage.index, num_mb) if schedule == "1f1b" else num_mb
                    assert stage.max_inflight_microbatches == kept
                    assert stage.memory.activations_bytes == kept * SAVED
                    assert stage.num_weight_versions == 1
                    assert stage.memory.weight_versions_bytes == 0


def test_pipedream_stashes_p_minus_s_weight_versions() -> None:
    for num_stages in range(1, 9):
        profile = chain_profile(2 * num_stages, fwd_ms=TF / 2, bwd_ms=TB / 2)
        for num_mb in (1, 2, 3, 8, 64):
            result = simulate(
                profile, even_plan(profile, num_stages, num_mb, "pipedream"), with_timeline=False
            )
            for stage in result.stages:
                versions = num_stages - stage.index
                assert stage.num_weight_versions == versions
                assert stage.memory.weight_versions_bytes == (versions - 1) * 2 * 10_000
                assert stage.memory.activations_bytes == versions * SAVED
            # No flush: the steady state has no bubble.
            assert close(result.step_time_ms, num_mb * (TF + TB)), (num_stages, num_mb)
            assert result.bubble_fraction < 1e-9


def test_static_memory_by_optimizer() -> None:
    profile = chain_profile(4)
    for optimizer, factor in (("sgd", 0), ("momentum", 1), ("adam", 2)):
        result = simulate(profile, even_plan(profile, 2, 4, "1f1b", optimizer=optimizer))
        memory = result.stages[0].memory
        assert memory.weights_bytes == memory.gradients_bytes == 20_000
        assert memory.optimizer_bytes == factor * 20_000
        assert memory.total_bytes == (2 + factor) * 20_000 + 2 * SAVED
        assert result.stages[0].peak_bytes == memory.total_bytes


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_recompute_adds_forward_before_backward_and_keeps_stage_inputs(schedule: str) -> None:
    for num_stages in range(1, 9):
        profile = chain_profile(2 * num_stages, fwd_ms=TF / 2, bwd_ms=TB / 2)
        for num_mb in (1, 2, 5, 16, 64):
            plan = even_plan(profile, num_stages, num_mb, schedule, policy="recompute")
            result = simulate(profile, plan, with_timeline=False)
            expected = (num_mb + num_stages - 1) * (TF + TF + TB)
            assert close(result.step_time_ms, expected), (num_stages, num_mb)
            for stage in result.stages:
                kept = min(num_stages - stage.index, num_mb) if schedule == "1f1b" else num_mb
                stage_input = 50 if stage.index == 0 else 100  # input_bytes, output_bytes
                # Checkpoints of the micro-batches in flight plus one rematerialized.
                assert stage.memory.activations_bytes == kept * stage_input + SAVED
                assert close(stage.recompute_ms, num_mb * TF)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream"])
def test_swap_with_free_host_link_costs_nothing_and_frees_activations(schedule: str) -> None:
    for num_stages in (1, 2, 4, 8):
        profile = chain_profile(2 * num_stages)
        for num_mb in (1, 4, 16):
            keep = simulate(profile, even_plan(profile, num_stages, num_mb, schedule))
            swap = simulate(
                profile, even_plan(profile, num_stages, num_mb, schedule, policy="swap")
            )
            assert close(swap.step_time_ms, keep.step_time_ms)
            for stage_keep, stage_swap in zip(keep.stages, swap.stages, strict=True):
                # At most the micro-batch being computed and the one fetched ahead of its
                # backward are on the device.
                assert stage_swap.memory.activations_bytes <= 2 * SAVED
                assert stage_swap.memory.activations_bytes <= stage_keep.memory.activations_bytes
                assert stage_swap.swap_bytes == num_mb * SAVED


def _host_cluster(out_gbps: float, in_gbps: float) -> Cluster:
    cluster = single_level_cluster(1)
    device = cluster.devices[0].model_copy(
        update={"device_to_host_gbps": out_gbps, "host_to_device_gbps": in_gbps}
    )
    return cluster.model_copy(update={"devices": [device]})


@pytest.mark.parametrize(
    "out_gbps,in_gbps", [(0.02, 0.01), (0.004, 0.05), (0.01, 0.0005), (1.0, 1.0), (0.001, 0.001)]
)
@pytest.mark.parametrize("num_mb", [1, 2, 3, 7, 16])
def test_swap_stall_is_the_unhidden_transfer(out_gbps: float, in_gbps: float, num_mb: int) -> None:
    """One stage, GPipe: swap-outs queue behind the forwards, except the last micro-batch's,
    whose backward comes next; each fetch starts when the op before its backward starts and
    the swap-outs before it have ended. With O the end of the last swap-out, the second
    backward waits for its fetch (y); later ones wait only where a fetch is longer than a
    backward (tb):

        O = max((m - 1) tf + x, tf + (m - 1) x)
        step = max(m tf + tb, max(m tf, O) + y) + (m - 2) max(tb, y) + tb   (m >= 2)
        step = tf + tb                                                     (m = 1)
    """
    profile = chain_profile(2, fwd_ms=TF / 2, bwd_ms=TB / 2)
    plan = even_plan(profile, 1, num_mb, "gpipe", policy="swap")
    result = simulate(profile, plan, _host_cluster(out_gbps, in_gbps))
    x = SAVED / gbps_to_bytes_per_ms(out_gbps)
    y = SAVED / gbps_to_bytes_per_ms(in_gbps)
    m = num_mb
    expected = TF + TB
    if m >= 2:
        last_out = max((m - 1) * TF + x, TF + (m - 1) * x)
        expected = max(m * TF + TB, max(m * TF, last_out) + y) + (m - 2) * max(TB, y) + TB
    assert close(result.step_time_ms, expected), (x, y, result.step_time_ms, expected)


def test_transfers_over_links() -> None:
    """Two stages, one micro-batch: forward, send, forward, backward, send back, backward."""
    profile = chain_profile(2, output_bytes=25_000)
    plan = even_plan(profile, 2, 1, "gpipe")
    transfer = 25_000 / gbps_to_bytes_per_ms(2.0)
    result = simulate(profile, plan, single_level_cluster(2, bandwidth_gbps=2.0))
    assert close(result.step_time_ms, 2 * 1.0 + 2 * 2.0 + 2 * transfer)
    sends = [op for op in result.timeline if op.op.startswith("send_")]
    assert [(op.op, op.stage, op.peer_stage, op.bytes) for op in sends] == [
        ("send_activation", 0, 1, 25_000),
        ("send_gradient", 1, 0, 25_000),
    ]


def test_hierarchy_picks_the_innermost_shared_level() -> None:
    from pipestudio.planner import cluster_template

    cluster = cluster_template([2, 2], [400.0, 10.0])
    assert cluster.bandwidth_gbps(0, 1) == 400.0
    assert cluster.bandwidth_gbps(1, 2) == 10.0
    assert cluster.bandwidth_gbps(2, 3) == 400.0
    assert cluster.bandwidth_gbps(3, 3) is None
    profile = chain_profile(4, output_bytes=50_000)
    fast = simulate(profile, even_plan(profile, 2, 1, "gpipe"), cluster)  # devices 0, 1
    plan = even_plan(profile, 2, 1, "gpipe")
    plan.stages[1].devices = [2]
    slow = simulate(profile, plan, cluster)  # devices 0, 2
    hop = 50_000 / gbps_to_bytes_per_ms(400.0), 50_000 / gbps_to_bytes_per_ms(10.0)
    assert close(fast.step_time_ms, 2 * 2.0 + 2 * 4.0 + 2 * hop[0])
    assert close(slow.step_time_ms, 2 * 2.0 + 2 * 4.0 + 2 * hop[1])


def test_replicas_all_reduce_before_the_update() -> None:
    """One stage with two replicas: each runs one micro-batch, then a ring all-reduce of
    2 (r-1)/r x parameters, then the update."""
    profile = chain_profile(2, update_ms=0.5, param_bytes=400_000)
    plan = even_plan(profile, 1, 2, "gpipe", replicas=[2])
    result = simulate(profile, plan, single_level_cluster(2, bandwidth_gbps=8.0))
    allreduce = 800_000 / gbps_to_bytes_per_ms(8.0)
    assert close(result.step_time_ms, 2.0 + 4.0 + allreduce + 1.0)
    assert [op.op for op in result.timeline if op.op == "allreduce"] == ["allreduce"]
    # Each replica runs half the micro-batches: forward, backward, update.
    assert close(result.stages[0].busy_ms, 2.0 + 4.0 + 1.0)


def test_update_time_follows_the_flush() -> None:
    profile = chain_profile(4, update_ms=0.25)
    for schedule in ("gpipe", "1f1b"):
        result = simulate(profile, even_plan(profile, 2, 4, schedule))
        # Stage 0 finishes last; its update (2 layers x 0.25) ends the step.
        assert close(result.step_time_ms, (4 + 2 - 1) * (2.0 + 4.0) + 0.5)


def test_multiple_steps_average() -> None:
    profile = chain_profile(4)
    for schedule in ("gpipe", "1f1b"):
        one = simulate(profile, even_plan(profile, 2, 4, schedule))
        three = simulate(profile, even_plan(profile, 2, 4, schedule), num_steps=3)
        assert close(three.step_time_ms, one.step_time_ms)
        assert {op.step for op in three.timeline} == {0, 1, 2}


def test_memory_over_limit_does_not_fit() -> None:
    profile = chain_profile(4)
    plan = even_plan(profile, 2, 8, "gpipe")
    unlimited = simulate(profile, plan)
    peak = max(stage.peak_bytes for stage in unlimited.stages)
    assert unlimited.fits
    assert simulate(profile, plan, single_level_cluster(2, memory=peak)).fits
    tight = simulate(profile, plan, single_level_cluster(2, memory=peak - 1))
    assert not tight.fits
    assert [stage.fits for stage in tight.stages] == [
        stage.peak_bytes <= peak - 1 for stage in unlimited.stages
    ]


def test_shared_device_serializes_compute() -> None:
    profile = chain_profile(2, output_bytes=0)
    plan = even_plan(profile, 2, 4, "gpipe")
    apart = simulate(profile, plan, single_level_cluster(2))
    assert close(apart.step_time_ms, (4 + 2 - 1) * (1.0 + 2.0))
    plan.stages[1].devices = [0]
    shared = simulate(profile, plan, single_level_cluster(2))
    # One device runs both stages' work back to back: 2 stages x 4 micro-batches x 3 ms.
    assert close(shared.step_time_ms, 2 * 4 * (1.0 + 2.0))


def test_stages_sharing_a_device_exchange_through_host_memory() -> None:
    """Stages 0 and 1 on device 0, whose host links take 1 and 2 ms for the 10 MB a
    micro-batch sends (80 and 40 Gbit/s): every activation and gradient costs out + in =
    3 ms on the shared device's staging path, plus the hop between the processes when the
    device's ``staging_gbps`` is set. One micro-batch of GPipe: forward 0,
    transfer, forward 1, backward 1, transfer, backward 0, in a chain."""
    profile = chain_profile(2, output_bytes=10**7)
    plan = even_plan(profile, 2, 1, "gpipe")
    plan.stages[1].devices = [0]
    cluster = _host_cluster(80.0, 40.0)
    staged = simulate(profile, plan, cluster)
    assert close(staged.step_time_ms, 1 + 3 + 1 + 2 + 3 + 2)
    sends = [op for op in staged.timeline if op.op.startswith("send_")]
    assert [round(op.end_ms - op.start_ms, 6) for op in sends] == [3.0, 3.0]
    # free host links (CPU slots, or no cluster): the exchange costs nothing, as before
    assert close(simulate(profile, plan).step_time_ms, 1 + 1 + 2 + 2)
    # on two devices the link between them carries it (10 MB at 100 Gbit/s: 0.8 ms)
    apart = simulate(profile, even_plan(profile, 2, 1, "gpipe"), single_level_cluster(2))
    assert close(apart.step_time_ms, 1 + 0.8 + 1 + 2 + 0.8 + 2)
    # the hop from one process to the other (gloo on the host, 20 Gbit/s: 4 ms) adds up
    device = cluster.devices[0].model_copy(update={"staging_gbps": 20.0})
    hopped = simulate(profile, plan, cluster.model_copy(update={"devices": [device]}))
    assert close(hopped.step_time_ms, 1 + 7 + 1 + 2 + 7 + 2)


def test_flops_per_step_and_achieved_tflops() -> None:
    """Four layers of 3 GFLOP forward and 6 backward per micro-batch, 4 micro-batches, two
    stages, the second of two replicas recomputing its layers: stage 0 does 4 x 2 x 9 = 72
    GFLOP a step, a replica of stage 1 2 x 2 x (9 + 3) = 48; the model 4 x 4 x 9 = 144
    (recomputes are not the model's work); each over the simulated step."""
    base = chain_profile(4)
    profile = base.model_copy(
        update={
            "layers": [
                layer.model_copy(update={"fwd_flops": 3 * 10**9, "bwd_flops": 6 * 10**9})
                for layer in base.layers
            ]
        }
    )
    plan = even_plan(profile, 2, 4, "1f1b", replicas=[1, 2])
    plan = plan.model_copy(
        update={"policies": {**plan.policies, "layer2": "recompute", "layer3": "recompute"}}
    )
    result = simulate(profile, plan)
    step = result.step_time_ms
    assert [stage.flops for stage in result.stages] == [72 * 10**9, 48 * 10**9]
    assert close(result.stages[1].tflops, 48 / step)  # 48e9 / (step / 1e3) / 1e12
    assert result.model_flops == 144 * 10**9 and close(result.model_tflops, 144 / step)
    assert (
        simulate(profile.rescaled(8), plan.model_copy(update={"microbatch_size": 8})).model_flops
        == 288 * 10**9
    )
    assert simulate(base, even_plan(base, 2, 4, "1f1b")).model_tflops == 0.0


def test_model_flop_utilisation_against_the_devices_peak() -> None:
    """MFU = the model's TFLOP/s over the workers' peak in the plan's precision, the peak
    found by the profile's device name (more specific names first); unknown devices and
    precisions give none."""
    base = chain_profile(4)
    layers = [
        layer.model_copy(update={"fwd_flops": 10**12, "bwd_flops": 2 * 10**12})
        for layer in base.layers
    ]
    profile = base.model_copy(
        update={"layers": layers, "precision": "bf16", "device": "NVIDIA H100 80GB HBM3 (cuda:0)"}
    )
    plan = even_plan(profile, 2, 4, "gpipe")
    result = simulate(profile, plan)
    assert result.mfu is not None
    assert close(result.mfu, result.model_tflops / (2 * 989.4))
    assert peak_tflops("NVIDIA H100 PCIe (cuda:1)", "bf16") == 756.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB (cuda:0)", "tf32") == 156.0
    assert peak_tflops("NVIDIA A10G (cuda:0)", "bf16") is None
    assert peak_tflops("NVIDIA V100-SXM2-16GB", "bf16") is None
    assert peak_tflops("cpu (2 threads)", "fp32") is None
    assert peak_tflops("Mine", "fp32", extra={"Mine": {"fp32": 2.0}}) == 2.0
    cpu = profile.model_copy(update={"device": "cpu (2 threads)"})
    assert simulate(cpu, plan).mfu is None
