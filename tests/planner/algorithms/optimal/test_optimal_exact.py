"""``optimal`` against every split times every policy, as the simulator scores them.

Each chain is simulated once per plan on an uncapped cluster (``simulate_every_straight_plan``)
and then given a device memory drawn between the least any plan needs and what the fastest
plan needs, so that memory binds; the fastest plan that fits is the fastest whose peak is
within the cap. ``optimal`` must return a plan that fits, that simulates to exactly that
step, and say that it is proven optimal.
"""

import math
import random

import pytest

from pipestudio.planner import Profile, cluster_template, simulate
from pipestudio.planner.algorithms.optimal.planner import optimal
from pipestudio.planner.algorithms.request import InfeasibleError, PlanRequest
from tests.planner.bruteforce import simulate_every_straight_plan
from tests.planner.helpers import exhaustive_cases

CHAINS = exhaustive_cases(300)
CHUNKS = 3


def random_chain(rng: random.Random) -> tuple[Profile, dict[str, object]]:
    """Up to 6 layers on up to 3 devices, gpipe or 1f1b, links and host links of several
    speeds (None: instantaneous)."""
    num_layers = rng.randint(1, 6)
    layers = [
        {
            "name": f"l{i}",
            "fwd_ms": rng.uniform(0.1, 5),
            "bwd_ms": rng.uniform(0.1, 8),
            "param_bytes": rng.randrange(10**6),
            "saved_bytes": rng.randrange(1, 10**7),
            "output_bytes": rng.randrange(1, 10**6),
            "workspace_bytes": rng.randrange(10**5),
            "update_ms": rng.choice([0.0, 0.1]),
        }
        for i in range(num_layers)
    ]
    profile = Profile.model_validate(
        {"model": "r", "microbatch_size": 1, "input_bytes": 5000, "layers": layers}
    )
    setting = {
        "num_devices": rng.randint(1, min(3, num_layers)),
        "schedule": rng.choice(["gpipe", "1f1b"]),
        "num_microbatches": rng.choice([2, 4, 8]),
        "link": rng.choice([None, 0.5, 5.0, 50.0]),
        "host": rng.choice([None, 1.0, 16.0]),
    }
    return profile, setting


def request_of(profile: Profile, setting: dict[str, object], memory: int | None) -> PlanRequest:
    devices = int(setting["num_devices"])  # type: ignore[call-overload]
    cluster = cluster_template(
        [devices],
        [setting["link"]],  # type: ignore[list-item]
        device_memory_bytes=memory,
        host_bandwidth_gbps=setting["host"],
    )  # type: ignore[arg-type]
    return PlanRequest(
        profile=profile,
        num_microbatches=setting["num_microbatches"],
        schedule=setting["schedule"],
        num_stages=devices,
        cluster=cluster,
        single_replica=True,
    )


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_optimal_is_the_fastest_plan_that_fits(chunk: int) -> None:
    rng = random.Random(2203)
    chains = [random_chain(rng) for _ in range(CHAINS)]
    caps = [rng.random() for _ in range(CHAINS)]
    binding = 0
    size = CHAINS // CHUNKS
    for (profile, setting), u in list(zip(chains, caps, strict=True))[
        chunk * size : (chunk + 1) * size
    ]:
        scored = simulate_every_straight_plan(request_of(profile, setting, None))
        least = min(peak for _, peak in scored)
        fastest_peak = min(scored)[1]
        memory = int(least + u * (fastest_peak - least))
        best = min(step for step, peak in scored if peak <= memory)
        binding += best > min(scored)[0] * (1 + 1e-9)
        request = request_of(profile, setting, memory)
        output = optimal(request)  # some plan fits, so this must not raise
        result = simulate(request.scaled, output.plan, request.cluster, with_timeline=False)
        assert result.fits, (setting, memory)
        assert math.isclose(result.step_time_ms, best, rel_tol=1e-9), (
            setting,
            memory,
            result.step_time_ms,
            best,
        )
        assert math.isclose(output.details["step_ms"], best, rel_tol=1e-9)
        assert output.details["step_optimal"] is True
        assert output.details["step_gap"] == 0.0
        if least > 0:  # below the least memory any plan needs, nothing fits
            with pytest.raises(InfeasibleError):
                optimal(request_of(profile, setting, least - 1))
    assert binding >= size // 4  # memory decides the answer in many chains
