"""The smallest device memory that fits: by hand, through ``run_planner``, and for pipedream."""

import pytest

from pipestudio.planner import Profile, cluster_template
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.min_memory import attempt, search_min_memory, with_device_memory
from pipestudio.planner.algorithms.request import (
    PlannerOutput,
    PlanRequest,
    call_planner,
    memory_only_cluster,
    run_planner,
)
from pipestudio.planner.errors import InfeasibleError

# One layer: 1000 parameter bytes, 100 saved bytes; SGD, gpipe, 4 micro-batches, 1 stage.
# Keeping it needs 2 x 1000 + 4 x 100 = 2400 bytes; recomputing it 2000 + 100 = 2100.
KEEP_BYTES, RECOMPUTE_BYTES = 2400, 2100


def one_layer(memory_bytes: int | None) -> PlanRequest:
    profile = Profile.model_validate(
        {
            "model": "one",
            "microbatch_size": 1,
            "layers": [
                {
                    "name": "only",
                    "fwd_ms": 1.0,
                    "bwd_ms": 2.0,
                    "param_bytes": 1000,
                    "saved_bytes": 100,
                }
            ],
        }
    )
    return PlanRequest(
        profile=profile,
        num_microbatches=4,
        schedule="gpipe",
        num_stages=1,
        optimizer="sgd",
        cluster=memory_only_cluster(1, memory_bytes),
    )


@pytest.mark.parametrize(
    "algorithm,expected", [("uniform", KEEP_BYTES), ("optimal", RECOMPUTE_BYTES)]
)
def test_search_by_hand(algorithm: str, expected: int) -> None:
    search = search_min_memory(PLANNERS[algorithm], one_layer(1000))
    assert search.min_memory_bytes is not None and search.precision_bytes is not None
    assert expected <= search.min_memory_bytes <= expected + search.precision_bytes
    assert search.precision_bytes == max(1, search.min_memory_bytes // 1000)
    assert not search.stopped_early


def test_run_planner_names_the_smallest_memory() -> None:
    outcome = run_planner("optimal", PLANNERS["optimal"], one_layer(2000))
    assert outcome.plan is None and outcome.error is not None
    memory = outcome.min_memory_bytes
    assert memory is not None and RECOMPUTE_BYTES <= memory <= RECOMPUTE_BYTES + 2
    assert f"the smallest device memory that fits is 2.05 KiB ({memory} bytes)" in outcome.error
    assert "against 1.95 KiB given" in outcome.error
    assert outcome.to_json_dict()["min_memory_bytes"] == memory
    with pytest.raises(InfeasibleError) as caught:
        call_planner(PLANNERS["optimal"], one_layer(2000))
    assert caught.value.min_memory_bytes == memory


def test_pipedream_memory_check_gets_the_same_treatment() -> None:
    # PipeDream's own check: a straight pipeline stashes activations and parameters.
    profile = Profile.model_validate(
        {
            "model": "chain3",
            "microbatch_size": 1,
            "layers": [
                {
                    "name": n,
                    "fwd_ms": f,
                    "bwd_ms": b,
                    "output_bytes": out,
                    "saved_bytes": out,
                    "param_bytes": par,
                }
                for n, f, b, out, par in [
                    ("a", 4, 6, 1_250_000, 0),
                    ("b", 8, 12, 2_500_000, 0),
                    ("c", 12, 18, 1_000_000, 12_500_000),
                ]
            ],
        }
    )
    request = PlanRequest(
        profile=profile,
        num_microbatches=6,
        schedule="pipedream",
        single_replica=True,
        cluster=cluster_template([3], [10.0], device_memory_bytes=2_499_999),
    )
    with pytest.raises(InfeasibleError, match="2499999 bytes per device"):
        PLANNERS["pipedream"](request)
    outcome = run_planner("pipedream", PLANNERS["pipedream"], request)
    memory = outcome.min_memory_bytes
    assert memory is not None and memory > 2_499_999
    assert f"({memory} bytes) per device" in (outcome.error or "")
    at_memory = with_device_memory(request, memory)
    assert at_memory is not None and attempt(PLANNERS["pipedream"], at_memory).fits


def test_no_memory_is_enough() -> None:
    def never(request: PlanRequest) -> PlannerOutput:
        raise InfeasibleError("nothing fits")

    outcome = run_planner("never", never, one_layer(2000))
    assert outcome.min_memory_bytes is None
    assert outcome.error == (
        "nothing fits; no device memory is enough: with unlimited memory it fails too: nothing fits"
    )


def test_out_of_time_reports_the_precision_reached() -> None:
    search = search_min_memory(PLANNERS["optimal"], one_layer(1000), budget_s=0.0)
    assert search.stopped_early and search.min_memory_bytes is not None
    assert search.precision_bytes == search.min_memory_bytes  # nothing was bisected
    assert "the search ran out of time" in search.describe()
    at_memory = with_device_memory(one_layer(1000), search.min_memory_bytes)
    assert at_memory is not None and attempt(PLANNERS["optimal"], at_memory).fits
