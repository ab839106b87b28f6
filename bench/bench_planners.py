"""Planner speed: every planner on a 2,000-layer chain on 16 devices (two servers of eight),
with a device memory that forces recompute or swap on the early stages, 1F1B, 32
micro-batches, replication allowed. Target: under 1 s each, on one core. Prints each
planner's time, its objective and the simulated step time; then, for information only,
``optimal`` under every schedule with and without replication (``--straight``), with its
proven gap and the replicas it chose."""

import os
import sys
from dataclasses import replace
from pathlib import Path

from pipestudio.planner import cluster_template
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.request import PlanRequest, run_planner
from pipestudio.planner.formats.plan import SCHEDULES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.planner.helpers import block_chain

TARGET_S = 1.0


def optimal_rows(request: PlanRequest) -> None:
    """``optimal`` under each schedule, straight or not: informational, not the target."""
    print(
        f"\noptimal, informational\n{'schedule':<10} {'straight':>8} {'seconds':>8} "
        f"{'objective ms':>13} {'gap':>9} {'step ms':>10} {'fits':>5}  replicas"
    )
    for schedule in SCHEDULES:
        for straight in (False, True):
            varied = replace(request, schedule=schedule, single_replica=straight)
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
    profile = block_chain()
    cluster = cluster_template(
        [8, 2], [400.0, 100.0], device_memory_bytes=40 * 2**30, host_bandwidth_gbps=200.0
    )
    request = PlanRequest(
        profile=profile,
        num_microbatches=32,
        schedule="1f1b",
        num_stages=16,
        cluster=cluster,
        single_replica=False,
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
