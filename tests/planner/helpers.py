"""Builders of profiles, plans and clusters for the planner's tests and benchmarks."""

import os
import random

from pipestudio.planner import Cluster, Plan, Profile, cluster_template
from pipestudio.planner.formats.plan import plan_template


def chain_profile(
    num_layers: int,
    *,
    fwd_ms: float = 1.0,
    bwd_ms: float = 2.0,
    saved_bytes: int = 1000,
    output_bytes: int = 100,
    param_bytes: int = 10_000,
    input_bytes: int = 50,
    workspace_bytes: int = 0,
    update_ms: float = 0.0,
    model: str = "uniform",
) -> Profile:
    layers = [
        {
            "name": f"layer{idx}",
            "kind": "Linear",
            "fwd_ms": fwd_ms,
            "bwd_ms": bwd_ms,
            "param_bytes": param_bytes,
            "saved_bytes": saved_bytes,
            "output_bytes": output_bytes,
            "workspace_bytes": workspace_bytes,
            "update_ms": update_ms,
        }
        for idx in range(num_layers)
    ]
    return Profile.model_validate(
        {"model": model, "microbatch_size": 4, "input_bytes": input_bytes, "layers": layers}
    )


def even_plan(
    profile: Profile,
    num_stages: int,
    num_microbatches: int,
    schedule: str,
    *,
    policy: str = "keep",
    optimizer: str = "adam",
    replicas: list[int] | None = None,
) -> Plan:
    plan = plan_template(profile, num_stages, num_microbatches, schedule, optimizer=optimizer)
    update: dict[str, object] = {"policies": {layer.name: policy for layer in profile.layers}}
    if replicas is not None:
        update["stages"] = [
            stage.model_copy(update={"replicas": r})
            for stage, r in zip(plan.stages, replicas, strict=True)
        ]
    return Plan.model_validate({**plan.model_dump(), **update})


def single_level_cluster(
    num_devices: int,
    *,
    bandwidth_gbps: float = 100.0,
    host_gbps: float | None = None,
    memory: int | None = None,
) -> Cluster:
    return cluster_template(
        [num_devices], [bandwidth_gbps], device_memory_bytes=memory, host_bandwidth_gbps=host_gbps
    )


def block_chain(num_layers: int = 2000, seed: int = 3) -> Profile:
    """A long chain of random blocks: bench/bench_planners.py's workload (under 1 s for
    every planner), which tests/planner/algorithms/pipedream checks the fast paths on."""
    rng = random.Random(seed)
    layers = [
        {
            "name": f"layer{idx}",
            "kind": "Block",
            "fwd_ms": rng.uniform(0.2, 1.0),
            "bwd_ms": rng.uniform(0.4, 2.0),
            "param_bytes": rng.randrange(2 * 10**6, 4 * 10**7),
            "saved_bytes": rng.randrange(10**6, 6 * 10**7),
            "output_bytes": rng.randrange(10**6, 8 * 10**6),
            "workspace_bytes": rng.randrange(0, 10**7),
            "update_ms": 0.01,
        }
        for idx in range(num_layers)
    ]
    return Profile.model_validate({"model": "bench-chain", "microbatch_size": 1, "layers": layers})


def exhaustive_cases(full: int) -> int:
    """How many random cases an exhaustive-search test runs: half of ``full`` in
    ``make test`` (its seeded first half), every one with ``PIPESTUDIO_EXHAUSTIVE=full``,
    the count docs/planners.md reports."""
    return full if os.environ.get("PIPESTUDIO_EXHAUSTIVE") == "full" else max(1, full // 2)
