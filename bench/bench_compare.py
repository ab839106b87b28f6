"""Every planner on the same cases, as ``pipestudio compare`` runs them: who wins, by how much.

Profiles: the fourteen PipeDream profiles in profiles/pipedream (imported as
``pipestudio import-pipedream GRAPH`` does, so one micro-batch is the file's minibatch) and
the built-in models' profiles in profiles/builtin. Cases: 4 and 8 stages, 1F1B and GPipe,
32 micro-batches, straight pipelines (``--straight``: one device per stage, so every planner
answers the same question), devices linked at LINK_GBPS and swapping to the host at
HOST_GBPS.

The memory cap of a case forces recompute or swap: with ``lo`` the smallest device memory at
which ``optimal`` finds a plan that fits (found by bisection to 0.1%,
``min_memory.search_min_memory``; it searches every split and memory policy, so no plan needs
much less) and ``hi`` the largest stage peak of the fastest plan with unlimited memory
(``optimal`` uncapped, which keeps every layer), the cap is
``lo + CAP_FRACTION x (hi - lo)``. Each planner then runs through ``request.run_planner``, the
code path of ``pipestudio compare``, and its plan is simulated on the capped cluster.

``optimal``'s gain over a baseline is baseline step time / optimal step time - 1, both
simulated; a baseline that finds no plan or whose plan does not fit gets no number. Writes
docs/img/bench_compare.json and plots docs/img/compare_*.png; prints the tables in
Markdown (docs/benchmarks.md). ``--plots-only`` redraws from the JSON;
``--profiles a,b`` and ``--schedules`` narrow the run, ``-o DIR`` writes elsewhere.
Planner times are wall clock on one pinned core of whatever machine runs it; a loaded
machine inflates them.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pipestudio.planner import Profile, cluster_template, load_document
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.min_memory import attempt, search_min_memory, with_device_memory
from pipestudio.planner.algorithms.request import PlanOutcome, PlanRequest, plan_cost, run_planner
from pipestudio.planner.formats.pipedream import import_pipedream

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
RESULTS_NAME = "bench_compare.json"
STAGES = (4, 8)
SCHEDULES = ("1f1b", "gpipe")
NUM_MICROBATCHES = 32
LINK_GBPS = 100.0
HOST_GBPS = 128.0  # PCIe 3.0 x16, about 16 GB/s
CAP_FRACTION = 0.5
BASELINES = [name for name in PLANNERS if name != "optimal"]
TIE = 1e-3  # gains within 0.1% count as ties


def profiles() -> dict[str, Profile]:
    found = {
        path.parent.name: import_pipedream(path)
        for path in sorted((ROOT / "profiles" / "pipedream").glob("*/graph.txt"))
    }
    for path in sorted((ROOT / "profiles" / "builtin").glob("*.json")):
        found[path.stem] = load_document(Profile, path)
    return found


def memory_cap(request: PlanRequest) -> dict[str, Any]:
    """The case's cap between the least memory any plan needs and the fastest plan's peak."""
    fastest = attempt(PLANNERS["optimal"], request)
    search = search_min_memory(PLANNERS["optimal"], request)
    if fastest.peak_bytes is None or search.min_memory_bytes is None:
        return {"error": str(fastest.error or search.failure)}
    low, high = search.min_memory_bytes, fastest.peak_bytes
    assert fastest.result is not None
    return {
        "lo_bytes": low,
        "hi_bytes": high,
        "cap_bytes": int(low + CAP_FRACTION * max(0, high - low)),
        "uncapped_step_ms": fastest.result.step_time_ms,
    }


def row(request: PlanRequest, outcome: PlanOutcome) -> dict[str, Any]:
    result, plan = outcome.result, outcome.plan
    entry: dict[str, Any] = {
        "algorithm": outcome.algorithm,
        "planner_ms": outcome.planner_ms,
        "objective_ms": outcome.objective_ms,
        "error": outcome.error,
        "min_memory_bytes": outcome.min_memory_bytes,
    }
    if result is not None and plan is not None:
        policies = list(plan.policies.values())
        entry |= {
            "step_ms": result.step_time_ms,
            "fits": result.fits,
            "bottleneck_ms": plan_cost(request, plan).bottleneck_ms,
            "num_stages": len(plan.stages),
            "peak_bytes": max(stage.peak_bytes for stage in result.stages),
            "num_recompute": policies.count("recompute"),
            "num_swap": policies.count("swap"),
            "gap": outcome.details.get("gap"),
        }
    return entry


def run_case(profile: Profile, num_stages: int, schedule: str) -> dict[str, Any]:
    cluster = cluster_template([num_stages], [LINK_GBPS], host_bandwidth_gbps=HOST_GBPS)
    request = PlanRequest(
        profile=profile,
        num_microbatches=NUM_MICROBATCHES,
        schedule=schedule,
        num_stages=num_stages,
        cluster=cluster,
        single_replica=True,
    )
    case: dict[str, Any] = {
        "profile": profile.model,
        "num_layers": profile.num_layers,
        "stages": num_stages,
        "schedule": schedule,
    }
    started = time.perf_counter()
    case |= memory_cap(request)
    if "cap_bytes" in case:
        capped = with_device_memory(request, case["cap_bytes"])
        assert capped is not None
        case["rows"] = [
            row(capped, run_planner(name, planner, capped, with_timeline=False))
            for name, planner in PLANNERS.items()
        ]
    case["case_s"] = time.perf_counter() - started
    return case


def gain(case: dict[str, Any], baseline: str, metric: str = "step_ms") -> float | str:
    """optimal's gain over ``baseline`` (a fraction) in simulated step time, or in
    ``bottleneck_ms`` (the stage model's slowest stage, what optimal minimises); or why
    there is none."""
    rows = {entry["algorithm"]: entry for entry in case.get("rows", [])}
    best, other = rows.get("optimal"), rows.get(baseline)
    if best is None or "step_ms" not in best or not best["fits"]:
        return "optimal: no plan"
    if other is None or "step_ms" not in other:
        return "no plan"
    if not other["fits"]:
        return "does not fit"
    return float(other[metric] / best[metric] - 1)


def gain_cell(value: float | str) -> str:
    if not isinstance(value, float):
        return value
    return "0.0%" if abs(value) < 5e-4 else f"{100 * value:+.1f}%"


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])


def gain_table(cases: list[dict[str, Any]], num_stages: int, schedule: str) -> str:
    """One row per profile: the cap, then per baseline step-time gain (bottleneck gain)."""
    chosen = [c for c in cases if c["stages"] == num_stages and c["schedule"] == schedule]
    rows = []
    for case in chosen:
        if "rows" not in case:
            rows.append([case["profile"], "no cap: " + case["error"], *(["-"] * len(BASELINES))])
            continue
        best = next(r for r in case["rows"] if r["algorithm"] == "optimal")
        policy = f"{best.get('num_recompute', 0)}R/{best.get('num_swap', 0)}S"
        cells = []
        for name in BASELINES:
            step, bottleneck = gain(case, name), gain(case, name, "bottleneck_ms")
            cells.append(
                gain_cell(step)
                + (f" ({gain_cell(bottleneck)})" if isinstance(bottleneck, float) else "")
            )
        rows.append([case["profile"], f"{case['cap_bytes'] / 2**30:.2f} GiB ({policy})", *cells])
    return markdown(["profile", "cap (optimal: recompute/swap layers)", *BASELINES], rows)


def percent(values: list[float], pick: Any) -> str:
    return gain_cell(float(pick(values))) if values else "-"


def summary_table(cases: list[dict[str, Any]]) -> str:
    """Per baseline and case family: median and max gain, ties, losses, and no numbers."""
    rows = []
    for num_stages in STAGES:
        for schedule in SCHEDULES:
            chosen = [c for c in cases if c["stages"] == num_stages and c["schedule"] == schedule]
            for name in BASELINES if chosen else []:
                values = [gain(c, name) for c in chosen]
                steps = [v for v in values if isinstance(v, float)]
                necks = [
                    v for c in chosen if isinstance(v := gain(c, name, "bottleneck_ms"), float)
                ]
                rows.append(
                    [
                        f"{num_stages}",
                        schedule,
                        name,
                        str(len(steps)),
                        percent(steps, min),
                        percent(steps, statistics.median),
                        percent(steps, max),
                        percent(necks, statistics.median),
                        percent(necks, max),
                        str(sum(abs(v) < TIE for v in steps)),
                        str(sum(v <= -TIE for v in steps)),
                        str(values.count("does not fit")),
                        str(values.count("no plan")),
                    ]
                )
    return markdown(
        [
            "stages",
            "schedule",
            "baseline",
            "compared",
            "min gain",
            "median gain",
            "max gain",
            "median bottleneck gain",
            "max bottleneck gain",
            "ties",
            "optimal slower",
            "does not fit",
            "no plan",
        ],
        rows,
    )


def outcome_table(cases: list[dict[str, Any]]) -> str:
    """Per planner, over every case: plans that fit, that do not, and no plan."""
    rows = []
    for name in PLANNERS:
        entries = [r for c in cases for r in c.get("rows", []) if r["algorithm"] == name]
        fits = sum(1 for r in entries if r.get("fits"))
        no_plan = sum(1 for r in entries if "step_ms" not in r)
        rows.append([name, str(fits), str(len(entries) - fits - no_plan), str(no_plan)])
    gaps = [
        r.get("gap") or 0.0
        for c in cases
        for r in c.get("rows", [])
        if r["algorithm"] == "optimal" and "step_ms" in r
    ]
    inexact = sorted(g for g in gaps if g > 1e-8)
    note = (
        f"\noptimal proven optimal (gap below 1e-8) in {len(gaps) - len(inexact)} of "
        f"{len(gaps)} cases; "
        f"elsewhere its gap (objective / proven lower bound - 1) has median "
        f"{100 * statistics.median(inexact):.1f}% and max {100 * max(inexact):.1f}%"
        if inexact
        else ""
    )
    return markdown(["planner", "fits", "does not fit", "no plan"], rows) + "\n" + note


def runtime_table(cases: list[dict[str, Any]]) -> str:
    times: dict[str, list[tuple[float, str]]] = {name: [] for name in PLANNERS}
    for case in cases:
        where = f"{case['profile']} {case['stages']} {case['schedule']}"
        for entry in case.get("rows", []):
            times[entry["algorithm"]].append((entry["planner_ms"], where))
    rows = []
    for name, pairs in times.items():
        ms = sorted(value for value, _ in pairs)
        if ms:
            rows.append(
                [
                    name,
                    f"{statistics.median(ms):.1f}",
                    f"{ms[int(0.9 * (len(ms) - 1))]:.1f}",
                    f"{ms[-1]:.1f}",
                    max(pairs)[1],
                ]
            )
    return markdown(["planner", "median ms", "90th percentile ms", "max ms", "slowest case"], rows)


def plot_gains(cases: list[dict[str, Any]], out_dir: Path, metric: str = "step_ms") -> Path:
    """A heat map per stage count and schedule: profiles x baselines, optimal's gain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    panels = [
        (k, s)
        for k in STAGES
        for s in SCHEDULES
        if any(c["stages"] == k and c["schedule"] == s for c in cases)
    ]
    names = list(dict.fromkeys(c["profile"] for c in cases))
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(4.2 * len(panels), 0.32 * len(names) + 2),
        squeeze=False,
        sharey=True,
    )
    norm = TwoSlopeNorm(vmin=-30, vcenter=0, vmax=100)
    for ax, (num_stages, schedule) in zip(axes[0], panels, strict=True):
        by_name = {
            c["profile"]: c
            for c in cases
            if c["stages"] == num_stages and c["schedule"] == schedule
        }
        values = [
            [gain(by_name[n], b, metric) if n in by_name else "-" for b in BASELINES] for n in names
        ]
        shade = [
            [100 * v if isinstance(v, float) else float("nan") for v in line] for line in values
        ]
        image = ax.imshow(shade, cmap="RdYlGn", norm=norm, aspect="auto")
        for y, line in enumerate(values):
            for x, value in enumerate(line):
                if isinstance(value, float):
                    text, color = f"{round(100 * value):d}", "black"
                else:
                    text = {"does not fit": "nf", "no plan": "np"}.get(value, "-")
                    color = "dimgray"
                ax.text(x, y, text, ha="center", va="center", fontsize=7, color=color)
        ax.set_xticks(range(len(BASELINES)), BASELINES, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_title(f"{num_stages} stages, {schedule}", fontsize=9)
    what = "simulated step time" if metric == "step_ms" else "bottleneck (stage model)"
    fig.colorbar(image, ax=axes[0].tolist(), label="optimal's gain, % (colours clipped)")
    fig.suptitle(
        f"optimal's gain in {what} over each baseline, % "
        "(nf: the baseline's plan does not fit, np: it found no plan)",
        fontsize=10,
    )
    path = out_dir / ("compare_gain.png" if metric == "step_ms" else "compare_gain_bottleneck.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_runtimes(cases: list[dict[str, Any]], out_dir: Path) -> Path:
    """Planner time against the profile's layer count, log scale, one series per planner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    markers = "osD^v<>"
    for idx, name in enumerate(PLANNERS):
        points = [
            (c["num_layers"], r["planner_ms"])
            for c in cases
            for r in c.get("rows", [])
            if r["algorithm"] == name
        ]
        ax.scatter(
            [p[0] for p in points],
            [max(p[1], 1e-2) for p in points],
            s=18,
            marker=markers[idx % len(markers)],
            label=name,
            alpha=0.75,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("layers in the profile")
    ax.set_ylabel("planner time, ms (one core, shared machine)")
    ax.set_title(
        "Planner time per case (4 and 8 stages, 1F1B and GPipe, capped memory)", fontsize=10
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path = out_dir / "compare_runtime.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def report(cases: list[dict[str, Any]], out_dir: Path) -> None:
    print("\n## plans that fit\n\n" + outcome_table(cases))
    print("\n## optimal's gain, summary\n\n" + summary_table(cases))
    for num_stages in STAGES:
        for schedule in SCHEDULES:
            if any(c["stages"] == num_stages and c["schedule"] == schedule for c in cases):
                print(
                    f"\n## {num_stages} stages, {schedule}\n\n"
                    + gain_table(cases, num_stages, schedule)
                )
    print("\n## planner time\n\n" + runtime_table(cases))
    print(
        f"\nplots: {plot_gains(cases, out_dir)}, "
        f"{plot_gains(cases, out_dir, 'bottleneck_ms')}, {plot_runtimes(cases, out_dir)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plots-only", action="store_true", help="redraw from the JSON")
    parser.add_argument("--profiles", help="comma-separated profile names (default: all)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=IMG,
        metavar="DIR",
        help=f"where the JSON and plots go (default {IMG.relative_to(ROOT)})",
    )
    args = parser.parse_args()
    out_dir: Path = args.output
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / RESULTS_NAME
    if args.plots_only:
        report(json.loads(results.read_text())["cases"], out_dir)
        return 0
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    chosen = profiles()
    if args.profiles:
        chosen = {name: chosen[name] for name in args.profiles.split(",")}
    cases = []
    for name, profile in chosen.items():
        for num_stages in STAGES:
            for schedule in args.schedules.split(","):
                case = run_case(profile, num_stages, schedule)
                case["profile"] = name
                cases.append(case)
                print(
                    f"{name:<14} {num_stages} {schedule:<5} {case['case_s']:7.1f} s "
                    f"cap {case.get('cap_bytes', 0) / 2**30:7.2f} GiB",
                    flush=True,
                )
    settings = {
        "stages": STAGES,
        "schedules": args.schedules.split(","),
        "num_microbatches": NUM_MICROBATCHES,
        "link_gbps": LINK_GBPS,
        "host_gbps": HOST_GBPS,
        "cap_fraction": CAP_FRACTION,
        "straight": True,
    }
    results.write_text(json.dumps({"settings": settings, "cases": cases}, indent=1))
    report(cases, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
