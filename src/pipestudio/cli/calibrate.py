"""``pipestudio calibrate``: a profile (and cluster) made to match what a run measured."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pipestudio.cli.output import format_table, write_document
from pipestudio.planner import Cluster, Plan, Profile, load_document
from pipestudio.planner.simulator.calibrate import (
    CalibrationError,
    Sharing,
    calibrate,
    op_events,
    read_events,
    report,
    run_plan,
)

_HELP = """\
Calibrate a profile from a run's measurements: every stage's forward, backward and update
take what the run's op events say they took (the profile keeps its split of a stage's work
among layers), and the links between stages the bandwidth the receivers felt. Simulate the
calibrated profile (on the calibrated cluster, --cluster-out) to predict the plan, or
another plan, as this machine runs it. The plan is the one the metrics name (pipestudio
train records it), over the steps before the run first migrated layers; --plan gives
another (the plan after a migration, with --steps).

examples:
  pipestudio train --plan plan.json --model mlp --steps 20 --metrics m.jsonl
  pipestudio calibrate mlp.json m.jsonl -o mlp.calibrated.json \\
      --cluster-out cluster.calibrated.json
  pipestudio simulate mlp.calibrated.json plan.json --cluster cluster.calibrated.json
"""


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "calibrate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_HELP,
        help="make a profile match a run's measured op times",
    )
    parser.add_argument("profile", metavar="PROFILE", help="the profile the plan was made from")
    parser.add_argument(
        "metrics", metavar="METRICS.jsonl", help="the run's metrics (pipestudio train --metrics)"
    )
    parser.add_argument(
        "--plan", metavar="PLAN", help="the plan the run ran (default: the one its metrics name)"
    )
    parser.add_argument(
        "--cluster",
        metavar="CLUSTER",
        help="the cluster the plan was predicted on (default: free links)",
    )
    parser.add_argument(
        "--steps",
        metavar="A:B",
        type=_steps,
        help="calibrate from steps A..B-1 (default: every step but the first)",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="CALIBRATED",
        help="where to write the calibrated profile (default: stdout)",
    )
    parser.add_argument(
        "--cluster-out",
        metavar="CLUSTER",
        help="write the cluster with the calibrated link bandwidths",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON (stderr keeps the files' names)",
    )
    parser.set_defaults(handler=_calibrate)


def _steps(text: str) -> range:
    start, sep, stop = text.partition(":")
    try:
        first, last = int(start), int(stop) if stop else 1 << 62
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B, steps A..B-1") from None
    if not sep or first < 0 or last <= first:
        raise argparse.ArgumentTypeError(f"{text!r}: expected A:B with 0 <= A < B")
    return range(first, last)


def _before(
    steps: range | None, migrated: int | None, events: list[dict[str, Any]], source: str
) -> range | None:
    """``steps`` where the run's starting plan held: before its first migration."""
    if migrated is None:
        return steps
    if steps is None:
        measured = sorted({op["step"] for op in op_events(events)})
        first = measured[1] if len(measured) > 1 else 0
        if first >= migrated:
            raise CalibrationError(
                f"{source}: the run migrated layers at step {migrated}, before any step "
                "but the first: give the plan after the migration (--plan) and --steps"
            )
        return range(first, migrated)
    if steps.stop > migrated:
        raise CalibrationError(
            f"--steps {_shown(steps)}: the run migrated layers at step {migrated}, so its "
            f"metrics' plan held until step {migrated - 1}; for later steps give the plan "
            f"after the migration (--plan) and --steps {migrated + 1}:"
        )
    return steps


def _shown(steps: range) -> str:
    return f"{steps.start}:" + ("" if steps.stop >= 1 << 61 else str(steps.stop))


def _calibrate(args: argparse.Namespace) -> int:
    profile = load_document(Profile, args.profile)
    cluster = load_document(Cluster, args.cluster) if args.cluster else None
    try:
        text = Path(args.metrics).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"cannot read {args.metrics}: {exc}") from None
    events = read_events(text.splitlines(), args.metrics)
    steps = args.steps
    if args.plan:
        plan = load_document(Plan, args.plan)
    else:
        plan, migrated = run_plan(events, args.metrics)
        steps = _before(steps, migrated, events, args.metrics)
    calibration = calibrate(
        profile, plan, events, cluster, steps, sharing=Sharing.of_run(plan, events)
    )
    write_document(calibration.profile, args.output)
    if args.cluster_out and calibration.cluster is not None:
        write_document(calibration.cluster, args.cluster_out)
    summary = report(calibration, profile, plan, cluster, events)
    if args.json:
        print(json.dumps(summary), file=sys.stdout if args.output else sys.stderr)
    else:
        print(format_report(summary), file=sys.stdout if args.output else sys.stderr)
    return 0


def format_report(summary: dict[str, Any]) -> str:
    rows = []
    for stage in summary["stages"]:
        for kind in ("forward", "backward", "update"):
            measured = stage["measured_ms"].get(kind)
            if measured is None:
                continue
            rows.append(
                [
                    str(stage["stage"]),
                    kind,
                    f"{stage['predicted_ms'].get(kind, 0):.3f}",
                    f"{measured:.3f}",
                    f"x{stage['factors'][kind]:.2f}",
                ]
            )
    lines = [
        format_table(
            ["stage", "op", "profiled ms", "measured ms", "factor"],
            rows,
            right=[True, False, True, True, True],
        )
    ]
    for level, gbps in summary["link_gbps"].items():
        lines.append(f"links at level {level}: {gbps:.3f} Gbit/s as the receivers felt them")
    if summary.get("op_overhead_ms"):
        lines.append(
            f"between two ops the engine spent {summary['op_overhead_ms']:.3f} ms "
            "(the calibrated profile's op_overhead_ms: each forward, backward and "
            "weight-gradient op pays it)"
        )
    for busy in summary["stage_busy_ms"]:
        lines.append(
            f"stage {busy['stage']} compute per step: measured {_ms(busy['measured'])}"
            f", predicted {_ms(busy['predicted'])}"
            f"{_error(busy['predicted'], busy['measured'])}, calibrated "
            f"{_ms(busy['calibrated'])}{_error(busy['calibrated'], busy['measured'])}"
        )
    step = summary["step_ms"]
    measured = step["measured"]
    lines.append(
        f"step: measured {_ms(measured)}, predicted {_ms(step['predicted'])}"
        f"{_error(step['predicted'], measured)}, calibrated {_ms(step['calibrated'])}"
        f"{_error(step['calibrated'], measured)} (steps {summary['steps'][0]}.."
        f"{summary['steps'][-1]})"
    )
    if summary.get("shared_cores"):
        lines.append(
            "predicted with the ranks that shared a host's cores or a GPU taking "
            "turns on it (the run's start events say where each ran)"
        )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _error(predicted: float, measured: float | None) -> str:
    """How far the measurement is off the prediction: measured / predicted - 1."""
    return (
        ""
        if not measured or not predicted
        else (f" (measured {100 * (measured / predicted - 1):+.1f}%)")
    )
