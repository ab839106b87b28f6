"""``--schedule auto`` on every stored profile: how often each schedule wins, and by how much.

Profiles: the fourteen PipeDream profiles (profiles/pipedream) and the built-in models'
(profiles/builtin). Each case: 4 devices linked at LINK_GBPS, swapping to the host at
HOST_GBPS, 8 micro-batches, one replica per stage; without a memory cap, and with the cap
of ``bench_compare.py`` (halfway between the least memory ``optimal``'s 1F1B plan can fit
in and the peak of its fastest plan without a cap). For each planner of ``--planners`` the
case runs ``request.run_planner`` with ``auto``, the code path of ``pipestudio compare
--schedule auto``: the planner's plans for gpipe and 1f1b, the 1F1B plan as zero-bubble,
and its plans of 8 and 16 chunks as interleaved-1f1b with 2 and 4 chunks per device
(``algorithms/schedules.py``); the fastest that fits wins. Prints, per planner and cap,
how often each schedule won and the median and largest gain of the winner over the
planner's own 1F1B plan (simulated steps), and writes every case to ``--json`` when given.
"""

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pipestudio.planner import Profile, cluster_template, load_document
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.min_memory import attempt, search_min_memory, with_device_memory
from pipestudio.planner.algorithms.request import PlanRequest, run_planner
from pipestudio.planner.formats.pipedream import import_pipedream

ROOT = Path(__file__).resolve().parents[1]
DEVICES = 4
NUM_MICROBATCHES = 8
LINK_GBPS = 100.0
HOST_GBPS = 128.0
CAP_FRACTION = 0.5


def profiles(names: list[str] | None) -> dict[str, Profile]:
    found = {
        path.parent.name: import_pipedream(path)
        for path in sorted((ROOT / "profiles" / "pipedream").glob("*/graph.txt"))
    }
    for path in sorted((ROOT / "profiles" / "builtin").glob("*.json")):
        found[path.stem] = load_document(Profile, path)
    return {name: p for name, p in found.items() if names is None or name in names}


def capped(request: PlanRequest) -> PlanRequest | None:
    """The request under ``bench_compare.py``'s cap, or None when optimal finds no bounds."""
    fastest = attempt(PLANNERS["optimal"], request)
    search = search_min_memory(PLANNERS["optimal"], request)
    if fastest.peak_bytes is None or search.min_memory_bytes is None:
        return None
    low, high = search.min_memory_bytes, fastest.peak_bytes
    return with_device_memory(request, int(low + CAP_FRACTION * max(0, high - low)))


def case(name: str, profile: Profile, planners: list[str]) -> list[dict[str, Any]]:
    cluster = cluster_template([DEVICES], [LINK_GBPS], host_bandwidth_gbps=HOST_GBPS)
    free = PlanRequest(
        profile=profile,
        num_microbatches=NUM_MICROBATCHES,
        schedule="1f1b",
        num_stages=DEVICES,
        cluster=cluster,
        single_replica=True,
    )
    rows = []
    for cap, request in (("none", free), ("half", capped(free))):
        if request is None:
            continue
        for algorithm in planners:
            started = time.perf_counter()
            outcome = run_planner(
                algorithm, PLANNERS[algorithm], request, with_timeline=False, auto=True
            )
            row: dict[str, Any] = {
                "profile": name,
                "cap": cap,
                "algorithm": algorithm,
                "seconds": time.perf_counter() - started,
                "error": outcome.error,
            }
            if outcome.plan is not None and outcome.result is not None:
                steps = outcome.details["schedules"]
                flat = steps.get("auto 1f1b", "")
                flat_ms = (
                    float(flat.split(" ms")[0])
                    if flat.endswith(" ms") and "fit" not in flat
                    else None
                )
                chunks = f" x{outcome.plan.virtual_stages}" if outcome.plan.interleaved else ""
                row |= {
                    "winner": outcome.plan.schedule + chunks,
                    "step_ms": outcome.result.step_time_ms,
                    "flat_ms": flat_ms,
                    "candidates": steps,
                }
            rows.append(row)
            print(
                f"  {name:<14} cap {cap:<4} {algorithm:<10} "
                + (
                    f"{row['winner']:<20} {row['step_ms']:9.1f} ms"
                    + (f" (1f1b {row['flat_ms']:.1f})" if row.get("flat_ms") else "")
                    if "winner" in row
                    else f"no plan: {str(row['error'])[:80]}"
                )
                + f"  [{row['seconds']:.1f} s]",
                flush=True,
            )
    return rows


def report(rows: list[dict[str, Any]]) -> None:
    print("\n| planner | cap | cases | wins by schedule | gain over 1f1b: median, largest |")
    print("|---|---|---|---|---|")
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        for cap in ("none", "half"):
            mine = [r for r in rows if r["algorithm"] == algorithm and r["cap"] == cap]
            won = [r for r in mine if "winner" in r]
            if not mine:
                continue
            wins = Counter(r["winner"] for r in won)
            gains = [r["flat_ms"] / r["step_ms"] - 1 for r in won if r.get("flat_ms")]
            shown = ", ".join(f"{k} {v}" for k, v in wins.most_common())
            gain = f"{statistics.median(gains):+.1%}, {max(gains):+.1%}" if gains else "-"
            print(f"| {algorithm} | {cap} | {len(won)} of {len(mine)} | {shown} | {gain} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--planners", default="dawnpiper,optimal")
    parser.add_argument("--profiles", default=None, help="names, comma-separated")
    parser.add_argument("--json", default=None, help="write every case here")
    options = parser.parse_args(argv)
    names = options.profiles.split(",") if options.profiles else None
    planners = options.planners.split(",")
    rows: list[dict[str, Any]] = []
    for name, profile in profiles(names).items():
        rows += case(name, profile, planners)
    report(rows)
    if options.json:
        Path(options.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
