"""Commands that ask the planners: plan, compare, max-batch."""

import argparse
import json
from typing import Any

from pipestudio.cli.documents import add_precision_option, describe_result
from pipestudio.cli.output import format_table, write_document
from pipestudio.planner import Cluster, PlannerError, Profile, load_document
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.maxbatch import (
    MAX_MICROBATCH_SIZE,
    MaxBatch,
    max_microbatch_size,
)
from pipestudio.planner.algorithms.min_memory import smallest_device_memory
from pipestudio.planner.algorithms.optimal.planner import step_claim
from pipestudio.planner.algorithms.request import (
    PlanOutcome,
    PlanRequest,
    memory_only_cluster,
    run_planner,
)
from pipestudio.planner.algorithms.schedules import AUTO
from pipestudio.planner.errors import InfeasibleError
from pipestudio.planner.formats.plan import PLANNED_SCHEDULES, Plan, check_precision
from pipestudio.planner.units import format_bytes, parse_size

_Formatter = argparse.RawDescriptionHelpFormatter


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "plan",
        formatter_class=_Formatter,
        help="ask one planner for a plan",
        description="Ask one planner how to split a model into stages (and which layers to "
        "recompute or swap),\nthen simulate its plan. Algorithms: " + ", ".join(PLANNERS) + ".",
    )
    _add_request_options(parser, algorithm=True, auto=True)
    parser.add_argument("-o", "--output", metavar="PLAN", help="write the plan JSON here")
    parser.add_argument(
        "--json", action="store_true", help='print {"plan", "result", "planner_ms", "objective_ms"}'
    )
    parser.set_defaults(handler=_plan)

    parser = commands.add_parser(
        "compare",
        formatter_class=_Formatter,
        help="run every planner on the same case",
        description="Run every planner on the same request and simulate each plan.",
    )
    _add_request_options(parser, algorithm=False, auto=True)
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"rows": [{"algorithm", "plan", "result", "planner_ms", '
        '"objective_ms", "error", "min_memory_bytes"}]}',
    )
    parser.set_defaults(handler=_compare)

    parser = commands.add_parser(
        "max-batch",
        formatter_class=_Formatter,
        help="the largest micro-batch size whose plan fits device memory",
        description="The largest micro-batch size (and so global batch) for which one planner "
        "finds a plan that fits\ndevice memory: DawnPiper's measure of memory "
        "efficiency (Peng et al. 2025). Needs --device-memory\nor a cluster whose "
        "devices have memory_bytes.",
    )
    _add_request_options(
        parser, algorithm=True, microbatch_help="first size tried (default: the profile's)"
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=MAX_MICROBATCH_SIZE,
        metavar="N",
        help=f"largest size tried (default {MAX_MICROBATCH_SIZE})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"microbatch_size", "global_batch", "plan", "result", '
        '"limit_reached", "search_ms", "trace"}',
    )
    parser.set_defaults(handler=_max_batch)


def _add_request_options(
    parser: argparse.ArgumentParser,
    *,
    algorithm: bool,
    microbatch_help: str = "samples per micro-batch (default: the profile's)",
    auto: bool = False,
) -> None:
    parser.add_argument("profile", metavar="PROFILE", help="profile JSON")
    if algorithm:
        parser.add_argument(
            "--algorithm",
            required=True,
            choices=list(PLANNERS),
            metavar="A",
            help=f"one of: {', '.join(PLANNERS)}",
        )
    parser.add_argument(
        "--stages",
        type=int,
        metavar="K",
        help="number of stages, one device each; for optimal the number "
        "of devices, which it may group into replicated stages; "
        "pipedream takes its shape from the cluster",
    )
    parser.add_argument(
        "--microbatches", type=int, required=True, metavar="M", help="micro-batches per step"
    )
    parser.add_argument(
        "--schedule",
        required=True,
        choices=(*PLANNED_SCHEDULES, AUTO) if auto else PLANNED_SCHEDULES,
        help="auto: the fastest fitting of gpipe, 1f1b, zero-bubble and interleaved-1f1b "
        "(2 or 4 chunks per device) for the planner's splits (docs/planners.md)"
        if auto
        else None,
    )
    parser.add_argument("--microbatch-size", type=int, metavar="N", help=microbatch_help)
    parser.add_argument("--optimizer", default="adam", choices=("sgd", "momentum", "adam"))
    add_precision_option(parser)
    hardware = parser.add_mutually_exclusive_group()
    hardware.add_argument("--cluster", metavar="CLUSTER", help="cluster JSON")
    hardware.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="memory per device, like 16GiB, on K devices with free links",
    )
    parser.add_argument(
        "--host-bandwidth-gbps",
        type=float,
        metavar="H",
        help="with --device-memory: device<->host bandwidth for swap (default: free)",
    )
    parser.add_argument(
        "--straight", action="store_true", help="no replicated stages (optimal, pipedream)"
    )


def build_request(args: argparse.Namespace) -> PlanRequest:
    profile = load_document(Profile, args.profile)
    if args.precision is not None:
        check_precision(args.precision, profile.precision, "--precision")
    cluster: Cluster | None = None
    if args.cluster:
        cluster = load_document(Cluster, args.cluster)
    elif args.device_memory or args.host_bandwidth_gbps:
        if args.stages is None:
            raise PlannerError("--device-memory needs --stages (the number of devices)")
        memory = parse_size(args.device_memory) if args.device_memory else None
        cluster = memory_only_cluster(args.stages, memory, args.host_bandwidth_gbps)
    return PlanRequest(
        profile=profile,
        num_microbatches=args.microbatches,
        schedule="1f1b" if args.schedule == AUTO else args.schedule,
        num_stages=args.stages,
        microbatch_size=args.microbatch_size,
        optimizer=args.optimizer,
        cluster=cluster,
        single_replica=args.straight,
    )


def _plan(args: argparse.Namespace) -> int:
    request = build_request(args)
    outcome = run_planner(
        args.algorithm, PLANNERS[args.algorithm], request, auto=args.schedule == AUTO
    )
    if outcome.error is not None:
        raise PlannerError(f"{args.algorithm}: {outcome.error}")
    assert outcome.plan is not None and outcome.result is not None
    if args.output:
        write_document(outcome.plan, args.output)
    if args.json:
        row = outcome.to_json_dict()
        print(
            json.dumps({key: row[key] for key in ("plan", "result", "planner_ms", "objective_ms")})
        )
    else:
        print(describe_result(outcome.result, outcome.plan))
        claim = step_claim(outcome.plan.provenance)
        print(
            f"\nplanner {args.algorithm}: {outcome.planner_ms:.1f} ms, "
            f"objective {outcome.objective_ms:.3f} ms"
            + ("" if claim is None else f"; simulated step {claim}")
        )
    return 0


def _compare(args: argparse.Namespace) -> int:
    request = build_request(args)
    outcomes = [
        run_planner(name, planner, request, with_timeline=args.json, auto=args.schedule == AUTO)
        for name, planner in PLANNERS.items()
    ]
    if args.json:
        print(json.dumps({"rows": [outcome.to_json_dict() for outcome in outcomes]}))
    else:
        print(compare_table(outcomes))
    return 0


def compare_table(outcomes: list[PlanOutcome]) -> str:
    rows = []
    for outcome in outcomes:
        if outcome.result is None:
            rows.append(
                [
                    outcome.algorithm,
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    f"{outcome.planner_ms:.1f}",
                    "-",
                    f"no plan: {outcome.error}",
                ]
            )
            continue
        result = outcome.result
        largest = result.largest_peak_bytes
        rows.append(
            [
                outcome.algorithm,
                f"{result.step_time_ms:.3f}",
                f"{result.samples_per_s:.1f}",
                f"{100 * result.bubble_fraction:.1f}%",
                format_bytes(largest),
                "yes" if result.fits else "NO",
                f"{outcome.planner_ms:.1f}",
                f"{outcome.objective_ms:.3f}",
                _claim(outcome.plan) if outcome.plan else "",
            ]
        )
    return format_table(
        [
            "algorithm",
            "step ms",
            "samples/s",
            "bubble",
            "largest peak",
            "fits",
            "planner ms",
            "objective ms",
            "",
        ],
        rows,
        right=[False, True, True, True, True, False, True, True, False],
    )


def _claim(plan: Plan) -> str:
    """What the plan's planner proved, and the schedule ``auto`` chose for it."""
    words = [step_claim(plan.provenance) or ""]
    if plan.provenance.get("schedule_chosen_by") == "auto":
        chunks = f" x{plan.virtual_stages}" if plan.interleaved else ""
        words.append(f"schedule {plan.schedule}{chunks} (auto)")
    return "; ".join(word for word in words if word)


def _max_batch(args: argparse.Namespace) -> int:
    request = build_request(args)
    try:
        answer = max_microbatch_size(
            PLANNERS[args.algorithm], request, limit=args.limit, with_timeline=args.json
        )
    except InfeasibleError as exc:
        raise InfeasibleError(
            f"{args.algorithm}: {exc}", exc.min_memory_bytes, exc.precision_bytes
        ) from exc
    if args.json:
        print(json.dumps(answer.to_json_dict()))
    else:
        print(describe_max_batch(args.algorithm, request, answer))
    return 0


def describe_max_batch(algorithm: str, request: PlanRequest, answer: MaxBatch) -> str:
    """The answer in words, the search's trace, then the plan at that size."""
    memory = format_bytes(smallest_device_memory(request.cluster) or 0)
    size = answer.microbatch_size
    lines = [
        f"{algorithm} on {request.profile.model}: the largest micro-batch that fits "
        f"{memory} per device is {size} samples",
        f"global batch {answer.global_batch} = {size} x {answer.num_microbatches} micro-batches",
    ]
    if answer.limit_reached:
        lines.append(
            f"the search stopped at its limit of {size}: larger sizes may fit too (--limit)"
        )
    else:
        lines.append(f"{size + 1} samples do not fit")
    tried = ", ".join(
        f"{entry.microbatch_size} {'fits' if entry.fits else 'no'}" for entry in answer.trace
    )
    lines.append(f"searched {len(answer.trace)} sizes in {answer.search_ms:.0f} ms: {tried}")
    return "\n".join([*lines, "", describe_result(answer.result, answer.plan)])
