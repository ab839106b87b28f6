"""The planners' stage model against the simulator it summarizes."""

import itertools
import math
import random

from pipestudio.planner import Plan, Profile, cluster_template, simulate
from pipestudio.planner.costs import stage_costs
from pipestudio.planner.plan import resolve_plan
from pipestudio.planner.stage_model import stage_contexts, stage_memory_bytes, stage_time_ms
from pipestudio.planner.units import gbps_to_bytes_per_ms


def random_case(rng: random.Random, schedule: str | None = None
                ) -> tuple[Profile, Plan, float | None, list[int]]:
    num_layers = rng.randint(2, 10)
    num_stages = rng.randint(1, min(4, num_layers))
    layers = [{"name": f"l{i}", "fwd_ms": rng.uniform(0.1, 5), "bwd_ms": rng.uniform(0.1, 8),
               "param_bytes": rng.randrange(10**6), "saved_bytes": rng.randrange(1, 10**6),
               "output_bytes": rng.randrange(1, 10**6), "workspace_bytes": rng.randrange(10**5),
               "update_ms": rng.choice([0.0, 0.2])}
              for i in range(num_layers)]
    profile = Profile.model_validate({"model": "r", "microbatch_size": 1, "input_bytes": 1000,
                                      "layers": layers})
    cuts = sorted(rng.sample(range(1, num_layers), num_stages - 1))
    bounds = [0, *cuts, num_layers]
    names = [layer["name"] for layer in layers]
    plan = Plan.model_validate({
        "model": "r", "schedule": schedule or rng.choice(["gpipe", "1f1b", "pipedream"]),
        "num_microbatches": rng.randint(1, 8), "microbatch_size": 1, "optimizer": "adam",
        "stages": [{"layers": names[a:b]} for a, b in itertools.pairwise(bounds)],
        "policies": {n: rng.choice(["keep", "swap", "recompute"]) for n in names}})
    host_gbps = rng.choice([None, rng.uniform(0.5, 20)])
    return profile, plan, host_gbps, bounds


def limit_swap(profile: Profile, plan: Plan, host_gbps: float | None) -> Plan:
    """Keep instead of swap in stages whose swap-out outlasts min(F, B)."""
    if host_gbps is None:
        return plan
    policies = dict(plan.policies)
    costs = stage_costs(profile, plan, resolve_plan(plan, profile))
    for stage, cost in zip(plan.stages, costs, strict=True):
        if cost.swap_bytes / gbps_to_bytes_per_ms(host_gbps) > min(cost.fwd_ms, cost.bwd_ms):
            policies.update({n: "keep" for n in stage.layers if policies[n] == "swap"})
    return plan.model_copy(update={"policies": policies})


def test_memory_model_equals_simulated_peak() -> None:
    rng = random.Random(3)
    checked = 0
    for _ in range(500):
        profile, plan, host_gbps, _ = random_case(rng)
        plan = limit_swap(profile, plan, host_gbps)
        num_stages = len(plan.stages)
        cluster = cluster_template([num_stages], [rng.choice([None, rng.uniform(1, 100)])],
                                   host_bandwidth_gbps=host_gbps)
        result = simulate(profile, plan, cluster)
        costs = stage_costs(profile, plan, resolve_plan(plan, profile))
        contexts = stage_contexts(plan.schedule, [1] * num_stages, plan.num_microbatches,
                                  plan.optimizer, cluster)
        for stage, cost, ctx in zip(result.stages, costs, contexts, strict=True):
            assert stage_memory_bytes(cost, ctx) == stage.peak_bytes, (plan, stage.index)
            checked += 1
    assert checked > 1000


def test_pipedream_steady_state_is_the_bottleneck() -> None:
    """With free links between stages, a pipedream step takes m x the slowest stage's time
    per micro-batch; never less, and exactly that in nearly every case (a few repeat over
    two steps with one slower)."""
    rng = random.Random(5)
    exact = total = 0
    for _ in range(200):
        profile, plan, host_gbps, _ = random_case(rng, "pipedream")
        plan = limit_swap(profile, plan, host_gbps)
        num_stages = len(plan.stages)
        cluster = cluster_template([num_stages], [None], host_bandwidth_gbps=host_gbps)
        result = simulate(profile, plan, cluster, num_steps=4)
        costs = stage_costs(profile, plan, resolve_plan(plan, profile))
        contexts = stage_contexts("pipedream", [1] * num_stages, plan.num_microbatches,
                                  plan.optimizer, cluster)
        bottleneck = max(stage_time_ms(c, x) for c, x in zip(costs, contexts, strict=True))
        expected = plan.num_microbatches * bottleneck
        assert result.step_time_ms >= expected * (1 - 1e-9)
        total += 1
        exact += math.isclose(result.step_time_ms, expected, rel_tol=1e-9)
    assert exact >= 0.95 * total, (exact, total)
