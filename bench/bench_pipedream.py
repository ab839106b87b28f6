"""The ``pipedream`` planner against PipeDream's own optimizer, on its recorded runs.

For every reference run made with ``--activation_compression_ratio 1`` (the planner's
setting; tests/planner/data/pipedream_reference.json) this plans the same profile on the same
cluster and prints our time (best of three, pinned to one CPU), the optimizer's recorded wall
time, their ratio, and whether the objective, the stage count and replicas, and the stage
node sets agree with the reference (ties between equally fast plans may differ in the last
two; see tests/planner/algorithms/pipedream/test_pipedream_planner.py). Target: every
configuration under 1 s.
Exits non-zero when a configuration is slower than that or its objective differs.
"""

import json
import math
import os
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

from pipestudio.planner import Profile, cluster_template
from pipestudio.planner.algorithms.pipedream.planner import pipedream
from pipestudio.planner.algorithms.request import PlannerOutput, PlanRequest
from pipestudio.planner.errors import PlannerError
from pipestudio.planner.formats.pipedream import import_pipedream

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "planner" / "data" / "pipedream_reference.json"
TARGET_S = 1.0
NUM_MICROBATCHES = 10080  # 2**5 * 3**2 * 5 * 7: divisible by every replica count of a level


@cache
def profile_of(model: str) -> Profile:
    return import_pipedream(ROOT / "profiles" / "pipedream" / model / "graph.txt")


def request_for(record: dict[str, Any]) -> PlanRequest:
    gbps: list[float | None] = [b * 8 / 1e9 for b in record["bandwidths_bytes_per_s"]]
    memory = record["memory_bytes"]
    cluster = cluster_template(
        record["levels"], gbps, device_memory_bytes=None if memory is None else int(memory)
    )
    return PlanRequest(
        profile=profile_of(record["model"]),
        num_microbatches=NUM_MICROBATCHES,
        schedule="pipedream",
        cluster=cluster,
        single_replica=record["straight"],
    )


def timed(request: PlanRequest) -> tuple[float, PlannerOutput | None]:
    best, output = math.inf, None
    for _ in range(3):
        start = time.perf_counter()
        try:
            output = pipedream(request)
        except PlannerError:
            output = None
        best = min(best, time.perf_counter() - start)
    return best, output


def verdicts(record: dict[str, Any], output: PlannerOutput | None) -> tuple[bool, str, str]:
    """(objective agrees, replicas verdict, node-set verdict)."""
    expected = record["time_per_minibatch_s"]
    if output is None or expected is None:
        return output is None and expected is None, "-", "-"
    agrees = math.isclose(output.objective_ms, expected * 1000, rel_tol=1e-9)
    ours = [
        [per_level[0], per_level[1] if len(per_level) > 1 else None]
        for per_level in output.details["replicas_per_level"]
    ]
    replicas = "same" if ours in record["replica_patterns"] else "tie"
    inputs = {layer.name for layer in profile_of(record["model"]).layers if layer.kind == "Input"}
    ours_nodes = [sorted(set(stage.layers)) for stage in output.plan.stages]
    theirs = [sorted(stage["nodes"]) for stage in record["stages"]]
    # PipeDream's dump leaves the removed __getitem__ sinks without a stage; we place them.
    placed = {name for stage in theirs for name in stage} | inputs
    nodes = "same" if [[n for n in s if n in placed] for s in ours_nodes] == theirs else "tie"
    return agrees, replicas, nodes


def main() -> int:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    records = [
        r
        for r in json.loads(REFERENCE.read_text())["records"]
        if r["activation_compression_ratio"] == 1.0
    ]
    print(
        f"{'configuration':<40} {'ours s':>8} {'theirs s':>9} {'speed-up':>9} "
        f"{'objective':>9} {'replicas':>8} {'nodes':>6}"
    )
    failures, worst = [], 0.0
    for record in records:
        seconds, output = timed(request_for(record))
        agrees, replicas, nodes = verdicts(record, output)
        worst = max(worst, seconds)
        if not agrees or seconds >= TARGET_S:
            failures.append(record["id"])
        print(
            f"{record['id']:<40} {seconds:>8.3f} {record['runtime_s']:>9.1f} "
            f"{record['runtime_s'] / seconds:>8.0f}x {'same' if agrees else 'DIFFERS':>9} "
            f"{replicas:>8} {nodes:>6}"
        )
    verdict = "PASS" if not failures else "FAIL"
    print(
        f"\n{verdict}: {len(records)} configurations, slowest {worst:.3f} s, target "
        f"{TARGET_S} s" + (f"; failed: {', '.join(failures)}" if failures else "")
    )
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
