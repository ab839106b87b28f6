"""``optimal --schedule auto`` against every split times every policy of every schedule,
as the simulator scores them, on small chains of 2 devices (where the bubble is large and
the new schedules matter).

What ``auto`` proves: its gpipe and 1f1b candidates are ``optimal``'s, each the fastest
plan of its schedule that fits (``optimal/test_optimal_exact.py``), so its answer is at
least as fast as every gpipe and 1f1b plan and fits wherever one does. Its zero-bubble and
interleaved candidates are derived from splits planned for 1f1b, not searched, so it does
not claim to be optimal over those schedules; the gap to the exhaustive best over all
four is printed and bounded here, and its figures are in docs/planners.md.
"""

import dataclasses
import math
import random
from collections.abc import Iterator

from pipestudio.planner import Profile, cluster_template, simulate
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.request import PlanRequest, run_planner
from pipestudio.planner.algorithms.schedules import derived
from pipestudio.planner.formats.plan import Plan
from tests.planner.algorithms.optimal.test_optimal_exact import random_chain
from tests.planner.bruteforce import every_straight_plan

#: (schedule, chunks per device) of the exhaustive search.
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("zero-bubble", 1), ("interleaved-1f1b", 2))
CHAINS = 12
#: The largest gap to the exhaustive best that these chains allow (measured: see the print).
MAX_GAP = 0.06


def every_plan(request: PlanRequest, schedule: str, chunks: int) -> Iterator[Plan]:
    """Every contiguous split into devices x chunks stages times every policy (3^n), run
    with ``schedule`` (chunk c on device c mod devices)."""
    chunked = (  # the chunks' plans are built as one stage per device of a larger cluster
        request
        if chunks == 1
        else dataclasses.replace(
            request, num_stages=(request.num_stages or 1) * chunks, cluster=None
        )
    )
    for plan in every_straight_plan(chunked):
        yield derived(plan, schedule, chunks)


def small_chain(rng: random.Random) -> tuple[Profile, dict[str, object]]:
    while True:
        profile, setting = random_chain(rng)
        if profile.num_layers == 4:
            return profile, {**setting, "num_microbatches": rng.choice([2, 4])}


def request_of(profile: Profile, setting: dict[str, object], memory: int | None) -> PlanRequest:
    cluster = cluster_template(
        [2],
        [setting["link"]],  # type: ignore[list-item]
        device_memory_bytes=memory,
        host_bandwidth_gbps=setting["host"],  # type: ignore[arg-type]
    )
    return PlanRequest(
        profile=profile,
        num_microbatches=int(setting["num_microbatches"]),  # type: ignore[call-overload]
        schedule="1f1b",
        num_stages=2,
        cluster=cluster,
        single_replica=True,
    )


def test_auto_is_at_least_the_proven_schedules_and_near_the_exhaustive_best() -> None:
    rng = random.Random(2711)
    gaps, wins = [], 0
    for _ in range(CHAINS):
        profile, setting = small_chain(rng)
        free = request_of(profile, setting, None)
        peaks = [
            max(stage.peak_bytes for stage in simulate(free.scaled, plan, None).stages)
            for plan in every_plan(free, "1f1b", 1)
        ]
        # a cap between the least and the most any 1f1b plan needs: memory binds
        memory = int(min(peaks) + rng.random() * (max(peaks) - min(peaks)))
        capped = request_of(profile, setting, memory)
        best = {}
        for schedule, chunks in SCHEDULES:
            results = [
                simulate(capped.scaled, plan, capped.cluster, with_timeline=False)
                for plan in every_plan(capped, schedule, chunks)
            ]
            best[schedule] = min((r.step_time_ms for r in results if r.fits), default=math.inf)
        outcome = run_planner(
            "optimal", PLANNERS["optimal"], capped, with_timeline=False, auto=True
        )
        assert outcome.result is not None and outcome.plan is not None, outcome.error
        assert outcome.result.fits
        proven = min(best["gpipe"], best["1f1b"])
        assert outcome.result.step_time_ms <= proven * (1 + 1e-9), (setting, memory, best)
        assert "step_optimal" not in outcome.plan.provenance or outcome.plan.schedule in (
            "gpipe",
            "1f1b",
        )
        gap = outcome.result.step_time_ms / min(best.values()) - 1
        wins += outcome.result.step_time_ms < proven * (1 - 1e-9)
        gaps.append(gap)
        print(
            f"\n{setting['num_microbatches']} micro-batches, cap {memory}: exhaustive "
            + ", ".join(f"{s} {ms:.2f}" for s, ms in best.items())
            + f"; auto {outcome.plan.schedule} {outcome.result.step_time_ms:.2f} ms, "
            f"gap {gap:.1%}"
        )
        assert gap <= MAX_GAP, (setting, memory, best, outcome.plan.schedule)
    print(f"\ngaps: {', '.join(f'{g:.1%}' for g in gaps)}; a new schedule won {wins}")
    assert wins >= 4  # the new schedules are chosen where they beat the proven ones
