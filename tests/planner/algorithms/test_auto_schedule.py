"""``--schedule auto`` (``algorithms/schedules.py``): the fastest fitting plan of the
synchronous schedules for a planner's splits, each candidate named in the provenance."""

import pytest

from pipestudio.planner import plan_template
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.request import PlanRequest, run_planner
from pipestudio.planner.algorithms.schedules import derived, over_memory_bytes
from pipestudio.planner.simulator.simulate import simulate
from tests.planner.helpers import chain_profile, single_level_cluster

CANDIDATES = (
    "gpipe",
    "1f1b",
    "zero-bubble",
    "interleaved-1f1b x2",
    "interleaved-1f1b x4",
)


def _request(memory: int | None, microbatches: int = 4, saved_bytes: int = 1000) -> PlanRequest:
    profile = chain_profile(16, fwd_ms=1.0, bwd_ms=2.0, saved_bytes=saved_bytes, param_bytes=10_000)
    return PlanRequest(
        profile=profile,
        num_microbatches=microbatches,
        schedule="1f1b",
        num_stages=4,
        cluster=single_level_cluster(4, memory=memory),
        single_replica=True,
    )


@pytest.mark.parametrize("algorithm", ["balance-time", "dawnpiper", "optimal"])
def test_auto_answers_the_fastest_fitting_candidate(algorithm: str) -> None:
    request = _request(memory=None)
    outcome = run_planner(algorithm, PLANNERS[algorithm], request, with_timeline=False, auto=True)
    assert outcome.plan is not None and outcome.result is not None, outcome.error
    rows = {
        k.removeprefix("auto "): v
        for k, v in outcome.plan.provenance.items()
        if k.startswith("auto ")
    }
    assert tuple(rows) == CANDIDATES
    steps = {label: float(text.split(" ms")[0]) for label, text in rows.items()}
    assert outcome.result.step_time_ms == pytest.approx(min(steps.values()), abs=1e-3)
    # bubble-heavy (4 stages, 4 micro-batches, free links): a new schedule wins over 1f1b
    assert outcome.plan.schedule in ("zero-bubble", "interleaved-1f1b")
    assert outcome.result.step_time_ms < steps["1f1b"]
    # the planner's own claim (optimal's proof) is not carried over to a derived schedule
    assert "step_optimal" not in outcome.plan.provenance
    assert outcome.plan.provenance["derived_from"] == f"1f1b plan of {algorithm}"
    plain = run_planner(algorithm, PLANNERS[algorithm], request, with_timeline=False)
    assert plain.result is not None
    assert plain.result.step_time_ms == pytest.approx(steps["1f1b"], abs=1e-3)


def test_auto_respects_the_memory_cap() -> None:
    """Under a cap that the 1F1B plan just fits, the choice fits and is the fastest of the
    candidates that fit; a cap nothing fits is a refusal listing every candidate."""
    planner = PLANNERS["balance-time"]
    heavy = 200_000  # activations outweigh the parameters: the schedules' memory differs
    flat = run_planner(
        "balance-time", planner, _request(None, 8, saved_bytes=heavy), with_timeline=False
    )
    assert flat.result is not None
    cap = max(stage.peak_bytes for stage in flat.result.stages)
    capped = _request(memory=cap, microbatches=8, saved_bytes=heavy)
    outcome = run_planner("balance-time", planner, capped, with_timeline=False, auto=True)
    assert outcome.result is not None and outcome.result.fits, outcome.error
    assert outcome.plan is not None
    rows = {k: v for k, v in outcome.plan.provenance.items() if str(k).startswith("auto ")}
    fitting = [float(str(v).split(" ms")[0]) for v in rows.values() if str(v).endswith(" ms")]
    assert outcome.result.step_time_ms == pytest.approx(min(fitting), abs=1e-3)
    # the cap binds: gpipe and interleaved x2 do not fit, and interleaved x4's plan as
    # derived from the planner's split held more than a device has; the climb, measuring
    # each device's chunks together, moved it until it fit, and it is then the fastest
    assert rows["auto gpipe"].endswith("does not fit")
    assert rows["auto interleaved-1f1b x2"].endswith("does not fit")
    assert outcome.plan.schedule == "interleaved-1f1b" and outcome.plan.virtual_stages == 4
    assert "(did not fit) ->" in outcome.plan.provenance["refined"]
    assert outcome.result.step_time_ms < float(rows["auto zero-bubble"].split(" ms")[0])
    again = simulate(capped.scaled, outcome.plan, capped.cluster, with_timeline=False)
    assert again.fits and again.step_time_ms == pytest.approx(outcome.result.step_time_ms)
    refused = run_planner(
        "balance-time", PLANNERS["balance-time"], _request(1), with_timeline=False, auto=True
    )
    assert refused.plan is None and refused.error is not None
    assert refused.error.startswith("no schedule fits (gpipe: ")
    assert all(label in refused.error for label in CANDIDATES)


def test_interleaving_needs_micro_batches_in_groups_of_the_devices() -> None:
    outcome = run_planner(
        "balance-time",
        PLANNERS["balance-time"],
        _request(None, microbatches=6),
        with_timeline=False,
        auto=True,
    )
    assert outcome.plan is not None
    assert (
        outcome.plan.provenance["auto interleaved-1f1b x2"] == "needs micro-batches a multiple of 4"
    )
    assert outcome.plan.schedule != "interleaved-1f1b"


def test_the_climb_counts_a_device_over_memory_by_its_chunks_together() -> None:
    """Under interleaved-1f1b a device holds several chunks: each chunk's peak may fit its
    device while their sum does not. The climb's measure of how far a plan is from fitting
    is the devices' peaks past their memory, not the chunks'."""
    profile = chain_profile(8, fwd_ms=1.0, bwd_ms=2.0, saved_bytes=50_000, param_bytes=10_000)
    plan = derived(plan_template(profile, 4, 4, "1f1b"), "interleaved-1f1b", 2)
    roomy = simulate(profile, plan, with_timeline=False)
    chunk_peak = max(stage.peak_bytes for stage in roomy.stages)
    device_peak = max(roomy.device_peak_bytes)
    assert chunk_peak < device_peak
    memory = (chunk_peak + device_peak) // 2
    result = simulate(profile, plan, single_level_cluster(2, memory=memory), with_timeline=False)
    assert not result.fits
    assert all(stage.peak_bytes <= memory for stage in result.stages)  # each chunk fits
    assert over_memory_bytes(result) == sum(
        max(0, peak - memory) for peak in result.device_peak_bytes
    )
    assert over_memory_bytes(result) > 0
