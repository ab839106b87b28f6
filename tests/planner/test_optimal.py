"""``optimal`` against exhaustive search, and against every other planner."""

import math
import random

import pytest

from pipestudio.planner import Profile, cluster_template, simulate
from pipestudio.planner.planners import PLANNERS
from pipestudio.planner.planners.optimal import optimal
from pipestudio.planner.request import InfeasibleError, PlanRequest, plan_cost
from tests.planner.bruteforce import brute_force_bottleneck


def random_request(rng: random.Random, *, capped: bool) -> PlanRequest:
    num_layers = rng.randint(1, 12)
    num_stages = rng.randint(1, min(4, num_layers))
    layers = [{"name": f"l{i}", "fwd_ms": rng.uniform(0.1, 5), "bwd_ms": rng.uniform(0.1, 8),
               "param_bytes": rng.randrange(10**6), "saved_bytes": rng.randrange(1, 10**6),
               "output_bytes": rng.randrange(1, 10**6), "workspace_bytes": rng.randrange(10**5),
               "update_ms": rng.choice([0.0, 0.1])}
              for i in range(num_layers)]
    profile = Profile.model_validate({"model": "r", "microbatch_size": 1, "input_bytes": 5000,
                                      "layers": layers})
    schedule = rng.choice(["gpipe", "1f1b", "pipedream"])
    num_mb = rng.randint(1, 8)
    host = rng.choice([None, rng.uniform(0.5, 20)])
    link = rng.choice([None, rng.uniform(0.5, 50)])
    memory = None
    if capped:
        loose = PlanRequest(profile=profile, num_microbatches=num_mb, schedule=schedule,
                            num_stages=num_stages)
        keep_all = max(plan_cost(loose, PLANNERS["uniform"](loose).plan).memory_bytes)
        memory = int(keep_all * rng.uniform(0.55, 0.98))
    cluster = cluster_template([num_stages], [link], device_memory_bytes=memory,
                               host_bandwidth_gbps=host)
    return PlanRequest(profile=profile, num_microbatches=num_mb, schedule=schedule,
                       num_stages=num_stages, cluster=cluster)


@pytest.mark.parametrize("capped", [False, True])
def test_optimal_equals_exhaustive_search(capped: bool) -> None:
    rng = random.Random(11 if capped else 12)
    feasible = 0
    for _ in range(150):
        request = random_request(rng, capped=capped)
        expected = brute_force_bottleneck(request)
        if math.isinf(expected):
            with pytest.raises(InfeasibleError):
                optimal(request)
            continue
        output = optimal(request)
        feasible += 1
        assert math.isclose(output.objective_ms, expected, rel_tol=1e-9), (request, expected)
        cost = plan_cost(request, output.plan)
        assert math.isclose(cost.bottleneck_ms, expected, rel_tol=1e-9)
        assert all(cost.fits)
        assert simulate(request.scaled, output.plan, request.cluster).fits
    assert feasible >= (100 if not capped else 60)
