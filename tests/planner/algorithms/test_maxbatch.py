"""``max_microbatch_size``: a case computed by hand, and the answer checked on VGG-16."""

import dataclasses
from functools import cache

import pytest

from pipestudio.planner import Profile, import_pipedream
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.maxbatch import max_microbatch_size
from pipestudio.planner.algorithms.min_memory import attempt, with_device_memory
from pipestudio.planner.algorithms.request import PlanRequest, memory_only_cluster
from pipestudio.planner.errors import InfeasibleError, PlannerError
from tests.conftest import PIPEDREAM_DIR

MEMORY_AWARE = ["optimal", "vpipe", "dawnpiper"]

# One layer, measured at 1 sample: 1000 parameter bytes, 100 saved bytes per sample, no input,
# output or workspace bytes. With SGD and gpipe over 4 micro-batches, one stage holds
# 2 x 1000 (weights, gradients) + 4 micro-batches x 100 N bytes when it keeps the layer, and
# 2000 + 100 N when it recomputes it (its checkpoint, the model's input, has no bytes).
PARAM_BYTES, SAVED_PER_SAMPLE, NUM_MICROBATCHES = 1000, 100, 4
MEMORY_BYTES = 2 * PARAM_BYTES + SAVED_PER_SAMPLE * 37 + 50


def one_layer_request(
    memory_bytes: int | None = MEMORY_BYTES, *, microbatch_size: int | None = None
) -> PlanRequest:
    profile = Profile.model_validate(
        {
            "model": "one",
            "microbatch_size": 1,
            "layers": [
                {
                    "name": "only",
                    "fwd_ms": 1.0,
                    "bwd_ms": 2.0,
                    "param_bytes": PARAM_BYTES,
                    "saved_bytes": SAVED_PER_SAMPLE,
                }
            ],
        }
    )
    return PlanRequest(
        profile=profile,
        num_microbatches=NUM_MICROBATCHES,
        schedule="gpipe",
        num_stages=1,
        optimizer="sgd",
        microbatch_size=microbatch_size,
        cluster=memory_only_cluster(1, memory_bytes),
    )


@pytest.mark.parametrize(
    "algorithm,expected",
    [
        ("uniform", (MEMORY_BYTES - 2 * PARAM_BYTES) // (NUM_MICROBATCHES * SAVED_PER_SAMPLE)),
        ("optimal", (MEMORY_BYTES - 2 * PARAM_BYTES) // SAVED_PER_SAMPLE),
    ],
)
def test_one_stage_by_hand(algorithm: str, expected: int) -> None:
    assert expected in (9, 37)  # the arithmetic above, spelled out
    answer = max_microbatch_size(PLANNERS[algorithm], one_layer_request())
    assert answer.microbatch_size == expected
    assert answer.global_batch == expected * NUM_MICROBATCHES
    assert not answer.limit_reached
    assert answer.result.fits and answer.plan.microbatch_size == expected
    peak = answer.result.stages[0].peak_bytes
    per_sample = SAVED_PER_SAMPLE * (NUM_MICROBATCHES if algorithm == "uniform" else 1)
    assert peak == 2 * PARAM_BYTES + per_sample * expected
    fits = {entry.microbatch_size: entry.fits for entry in answer.trace}
    assert fits[expected] and not fits[expected + 1]


def test_starting_above_or_below_gives_the_same_answer() -> None:
    for start in (1, 5, 37, 38, 1000):
        answer = max_microbatch_size(PLANNERS["optimal"], one_layer_request(microbatch_size=start))
        assert answer.microbatch_size == 37, start


def test_limit_is_reported() -> None:
    answer = max_microbatch_size(PLANNERS["optimal"], one_layer_request(10**9), limit=20)
    assert answer.microbatch_size == 20 and answer.limit_reached
    assert max(entry.microbatch_size for entry in answer.trace) == 20


def test_needs_a_device_memory() -> None:
    with pytest.raises(PlannerError, match="max-batch needs a device memory"):
        max_microbatch_size(PLANNERS["optimal"], one_layer_request(None))


def test_other_mistakes_are_not_hidden() -> None:
    request = dataclasses.replace(one_layer_request(), num_stages=None)
    with pytest.raises(PlannerError, match="algorithm 'optimal' needs --stages") as caught:
        max_microbatch_size(PLANNERS["optimal"], request)
    assert not isinstance(caught.value, InfeasibleError)


def test_nothing_fits_names_the_memory_for_one_sample() -> None:
    too_small = 2 * PARAM_BYTES + SAVED_PER_SAMPLE - 1  # one sample needs 2100 bytes
    with pytest.raises(InfeasibleError, match="not even a micro-batch of 1 sample") as caught:
        max_microbatch_size(PLANNERS["optimal"], one_layer_request(too_small))
    memory = caught.value.min_memory_bytes
    precision = caught.value.precision_bytes
    assert memory is not None and precision is not None
    assert (
        2 * PARAM_BYTES + SAVED_PER_SAMPLE
        <= memory
        <= 2 * PARAM_BYTES + SAVED_PER_SAMPLE + precision
    )
    assert f"({memory} bytes)" in str(caught.value)


@cache
def vgg16() -> Profile:
    return import_pipedream(PIPEDREAM_DIR / "vgg16" / "graph.txt", batch_size=64)


def fits_at(algorithm: str, request: PlanRequest, size: int) -> bool:
    return attempt(PLANNERS[algorithm], dataclasses.replace(request, microbatch_size=size)).fits


@pytest.mark.parametrize("algorithm", MEMORY_AWARE)
def test_vgg16_answer_fits_and_one_more_does_not(algorithm: str) -> None:
    request = PlanRequest(
        profile=vgg16(),
        num_microbatches=8,
        schedule="1f1b",
        num_stages=4,
        cluster=memory_only_cluster(4, 4 * 2**30),
    )
    answer = max_microbatch_size(PLANNERS[algorithm], request)
    size = answer.microbatch_size
    assert size >= 1 and not answer.limit_reached
    assert fits_at(algorithm, request, size)
    assert not fits_at(algorithm, request, size + 1)
    assert len(answer.trace) <= 2 * 8  # log2 of the answer, twice, from 64
    assert all(stage.peak_bytes <= 4 * 2**30 for stage in answer.result.stages)


def test_vgg16_more_memory_fits_more() -> None:
    request = PlanRequest(
        profile=vgg16(),
        num_microbatches=8,
        schedule="1f1b",
        num_stages=4,
        cluster=memory_only_cluster(4, 4 * 2**30),
    )
    larger = with_device_memory(request, 8 * 2**30)
    assert larger is not None
    small = max_microbatch_size(PLANNERS["optimal"], request).microbatch_size
    assert max_microbatch_size(PLANNERS["optimal"], larger).microbatch_size > small
