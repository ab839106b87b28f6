"""Simulator speed: one step of a 2,000-layer profile on 16 stages with 64 micro-batches.

Target: under 0.5 s on one core. Runs pinned to one CPU; prints the best of five runs for
each schedule, with and without building the timeline, with a third of the layers kept,
a third recomputed and a third swapped. ``pipedream`` simulates warm-up and drain steps
around the measured one, so it does about four steps' work.
"""

import os
import random
import sys
import time

from pipestudio.planner import Plan, Profile, cluster_template, simulate

TARGET_S = 0.5


def big_profile(num_layers: int = 2000, seed: int = 7) -> Profile:
    rng = random.Random(seed)
    layers = [
        {
            "name": f"layer{idx}",
            "kind": "Block",
            "fwd_ms": rng.uniform(0.1, 2.0),
            "bwd_ms": rng.uniform(0.2, 4.0),
            "param_bytes": rng.randrange(10**6, 10**8),
            "saved_bytes": rng.randrange(10**6, 10**8),
            "output_bytes": rng.randrange(10**5, 10**7),
            "workspace_bytes": rng.randrange(0, 10**7),
            "update_ms": 0.01,
        }
        for idx in range(num_layers)
    ]
    return Profile.model_validate({"model": "bench", "microbatch_size": 1, "layers": layers})


def plan_for(profile: Profile, schedule: str, num_stages: int = 16, num_mb: int = 64) -> Plan:
    names = [layer.name for layer in profile.layers]
    size = len(names) // num_stages
    policies = {name: ("keep", "recompute", "swap")[idx % 3] for idx, name in enumerate(names)}
    return Plan.model_validate(
        {
            "model": profile.model,
            "schedule": schedule,
            "num_microbatches": num_mb,
            "microbatch_size": 1,
            "stages": [{"layers": names[i * size : (i + 1) * size]} for i in range(num_stages)],
            "policies": policies,
        }
    )


def main() -> int:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    profile = big_profile()
    cluster = cluster_template(
        [8, 2], [400.0, 100.0], device_memory_bytes=80 * 2**30, host_bandwidth_gbps=256.0
    )
    worst = 0.0
    print(f"{'schedule':<10} {'timeline':<9} {'best s':>8} {'ops':>7} {'target s':>9} {'ratio':>6}")
    for schedule in ("gpipe", "1f1b", "pipedream"):
        plan = plan_for(profile, schedule)
        for with_timeline in (False, True):
            best, ops = float("inf"), 0
            for _ in range(5):
                start = time.perf_counter()
                result = simulate(profile, plan, cluster, with_timeline=with_timeline)
                best = min(best, time.perf_counter() - start)
                ops = len(result.timeline)
            worst = max(worst, best)
            print(
                f"{schedule:<10} {'yes' if with_timeline else 'no':<9} {best:>8.3f} "
                f"{ops or '-':>7} {TARGET_S:>9.1f} {best / TARGET_S:>6.2f}"
            )
    verdict = "PASS" if worst < TARGET_S else "FAIL"
    print(
        f"\n{verdict}: slowest one-step simulation {worst:.3f} s, target {TARGET_S} s "
        f"(ratio {worst / TARGET_S:.2f})"
    )
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
