"""The engine's time between two compute ops (``Profile.op_overhead_ms``): paid once by each
forward, backward and weight-gradient op, whatever the op holds."""

import math
import random

import pytest

from pipestudio.planner import Plan, Profile, plan_template, simulate
from pipestudio.planner.algorithms.schedules import derived
from tests.planner.helpers import chain_profile, even_plan

TF, TB = 1.25, 2.5  # per stage: two layers of 0.625 / 1.25 ms


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_forward_and_backward_pays_it_once(schedule: str) -> None:
    # (m + p - 1) (F + B) with free links: each op is c longer, so (m + p - 1)(F + B + 2c)
    for overhead in (0.1, 0.8):
        for num_stages in range(1, 6):
            profile = chain_profile(2 * num_stages, fwd_ms=TF / 2, bwd_ms=TB / 2)
            profile = profile.model_copy(update={"op_overhead_ms": overhead})
            for num_mb in range(1, 17):
                step = simulate(
                    profile, even_plan(profile, num_stages, num_mb, schedule), with_timeline=False
                ).step_time_ms
                expected = (num_mb + num_stages - 1) * (TF + TB + 2 * overhead)
                assert math.isclose(step, expected, rel_tol=1e-9), (num_stages, num_mb)


def _one_layer_per_chunk(rng: random.Random, num_layers: int) -> Profile:
    layers = []
    for idx in range(num_layers):
        weight, inputs = rng.uniform(0.2, 2), rng.uniform(0.2, 2)
        layers.append(
            {
                "name": f"l{idx}",
                "fwd_ms": rng.uniform(0.2, 2),
                "bwd_ms": (weight + inputs) * rng.uniform(0.8, 1.0),
                "bwd_weight_ms": weight,
                "bwd_input_ms": inputs,
                "param_bytes": 1000,
                "saved_bytes": 500,
                "output_bytes": rng.randrange(100, 10_000),
                "update_ms": rng.uniform(0, 0.5),
            }
        )
    return Profile.model_validate({"model": "m", "microbatch_size": 1, "layers": layers})


def _folded(profile: Profile, overhead: float) -> Profile:
    """Each layer's forward, backward and backward halves ``overhead`` longer, none between."""
    return profile.model_copy(
        update={
            "layers": [
                layer.model_copy(
                    update={
                        "fwd_ms": layer.fwd_ms + overhead,
                        "bwd_ms": layer.bwd_ms + overhead,
                        "bwd_weight_ms": (layer.bwd_weight_ms or 0) + overhead,
                        "bwd_input_ms": (layer.bwd_input_ms or 0) + overhead,
                    }
                )
                for layer in profile.layers
            ]
        }
    )


def _plan(profile: Profile, schedule: str, num_mb: int) -> Plan:
    if schedule == "interleaved-1f1b":  # 2 devices, a layer per chunk
        return derived(
            plan_template(profile, len(profile.layers), num_mb, "1f1b"), "interleaved-1f1b", 2
        )
    return plan_template(profile, len(profile.layers), num_mb, schedule)


@pytest.mark.parametrize(
    "schedule", ["gpipe", "1f1b", "pipedream", "zero-bubble", "interleaved-1f1b"]
)
def test_an_op_of_one_layer_pays_it_as_if_the_layer_held_it(schedule: str) -> None:
    """With a layer per stage (a chunk: interleaved), the overhead c between ops is the same
    as every layer's forward, backward and backward halves c longer: the same step and the
    same ops, the updates untouched. An interleaved device of two chunks pays it for each."""
    rng = random.Random(11)
    for _ in range(8):
        profile = _one_layer_per_chunk(rng, 4)
        overhead = rng.uniform(0.05, 1.5)
        plan = _plan(profile, schedule, rng.choice([2, 4, 8]))
        paid = simulate(profile.model_copy(update={"op_overhead_ms": overhead}), plan)
        folded = simulate(_folded(profile, overhead), plan)
        assert math.isclose(paid.step_time_ms, folded.step_time_ms, rel_tol=1e-9)
        assert paid.timeline is not None and folded.timeline is not None
        assert len(paid.timeline) == len(folded.timeline)
        for mine, theirs in zip(paid.timeline, folded.timeline, strict=True):
            assert (mine.op, mine.stage, mine.microbatch) == (
                theirs.op,
                theirs.stage,
                theirs.microbatch,
            )
            assert math.isclose(
                mine.end_ms - mine.start_ms,
                theirs.end_ms - theirs.start_ms,
                rel_tol=1e-9,
                abs_tol=1e-9,
            )
        without = simulate(profile, plan, with_timeline=False).step_time_ms
        assert paid.step_time_ms > without


def test_it_does_not_scale_with_the_micro_batch() -> None:
    profile = chain_profile(4, fwd_ms=1.0, bwd_ms=2.0).model_copy(update={"op_overhead_ms": 0.5})
    larger = profile.rescaled(4 * profile.microbatch_size)
    assert larger.layers[0].fwd_ms == 4 * profile.layers[0].fwd_ms
    assert larger.op_overhead_ms == 0.5


@pytest.mark.parametrize("value", [-0.1, math.inf, math.nan, "1", True, 2e9])
def test_a_bad_overhead_is_refused_by_name(value: object) -> None:
    document = chain_profile(2).model_dump(mode="json") | {"op_overhead_ms": value}
    with pytest.raises(ValueError, match="op_overhead_ms"):
        Profile.model_validate(document)
