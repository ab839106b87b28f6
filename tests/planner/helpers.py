"""Builders of small profiles, plans and clusters for the planner tests."""

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
