"""Planner speed: every planner on a 2,000-layer chain on 16 devices (two servers of eight),
with a device memory that forces recompute or swap on the early stages, 1F1B, 32
micro-batches, replication allowed. Target: under 1 s each, on one core. Prints each
planner's time, its objective and the simulated step time; then, for information only,
``optimal`` under every schedule with and without replication (``--straight``), with its
proven gap and the replicas it chose."""

import os
import random
import sys
from dataclasses import replace

from pipestudio.planner import Profile, cluster_template
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.request import PlanRequest, run_planner
from pipestudio.planner.formats.plan import SCHEDULES

TARGET_S = 1.0


def chain(num_layers: int = 2000, seed: int = 3) -> Profile:
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


def optimal_rows(request: PlanRequest) -> None:
    """``optimal`` under each schedule, straight or not: informational, not the target."""
    print(
        f"\noptimal, informational\n{'schedule':<10} {'straight':>8} {'seconds':>8} "
        f"{'objective ms':>13} {'gap':>9} {'step ms':>10} {'fits':>5}  replicas"
    )
    for schedule in SCHEDULES:
        for straight in (False, True):
            varied = replace(request, schedule=schedule, straight=straight)
            outcome = run_planner("optimal", PLANNERS["optimal"], varied, with_timeline=False)
            seconds = outcome.planner_ms / 1e3
            if outcome.result is None:
                print(f"{schedule:<10} {straight!s:>8} {seconds:>8.3f}  {outcome.error}")
                continue
            replicas = outcome.details["replicas"]
            shown = "all 1" if max(replicas) == 1 else ",".join(map(str, replicas))
            print(
                f"{schedule:<10} {straight!s:>8} {seconds:>8.3f} "
                f"{outcome.objective_ms:>13.3f} {outcome.details['gap']:>9.2e} "
                f"{outcome.result.step_time_ms:>10.1f} {outcome.result.fits!s:>5}  {shown}"
            )


def main() -> int:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    profile = chain()
    cluster = cluster_template(
        [8, 2], [400.0, 100.0], device_memory_bytes=40 * 2**30, host_bandwidth_gbps=200.0
    )
    request = PlanRequest(
        profile=profile,
        num_microbatches=32,
        schedule="1f1b",
        num_stages=16,
        cluster=cluster,
        straight=False,
    )
    worst = 0.0
    print(f"{'planner':<14} {'seconds':>8} {'objective ms':>13} {'step ms':>10} {'fits':>5}")
    for name, planner in PLANNERS.items():
        outcome = run_planner(name, planner, request, with_timeline=False)
        seconds = outcome.planner_ms / 1e3
        worst = max(worst, seconds)
        if outcome.result is None:
            print(f"{name:<14} {seconds:>8.3f} {'-':>13} {'-':>10} {'-':>5}  {outcome.error}")
            continue
        print(
            f"{name:<14} {seconds:>8.3f} {outcome.objective_ms:>13.3f} "
            f"{outcome.result.step_time_ms:>10.1f} {outcome.result.fits!s:>5}"
        )
    optimal_rows(request)
    verdict = "PASS" if worst < TARGET_S else "FAIL"
    print(
        f"\n{verdict}: slowest planner {worst:.3f} s, target {TARGET_S} s "
        f"(ratio {worst / TARGET_S:.2f})"
    )
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
