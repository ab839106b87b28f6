"""Commands on the formats and the simulator: import, templates, simulate, schema."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pipestudio.cli.output import format_table, write_document
from pipestudio.planner import (
    Cluster,
    Plan,
    PlannerError,
    Profile,
    SimResult,
    cluster_template,
    import_pipedream,
    load_document,
    plan_template,
    resolve_plan,
    simulate,
    write_chrome_trace,
)
from pipestudio.planner.formats.documents import PRECISIONS, parse_document
from pipestudio.planner.formats.plan import SCHEDULES, check_precision
from pipestudio.planner.formats.schemas import DOCUMENTS, json_schema
from pipestudio.planner.simulator.peaks import model_flop_utilisation
from pipestudio.planner.units import format_bytes, parse_size

_Formatter = argparse.RawDescriptionHelpFormatter


def add_commands(commands: Any) -> None:
    _add_import_pipedream(commands)
    _add_plan_template(commands)
    _add_cluster_template(commands)
    _add_simulate(commands)
    _add_schema(commands)
    _add_validate(commands)


def _add_import_pipedream(commands: Any) -> None:
    parser = commands.add_parser(
        "import-pipedream",
        formatter_class=_Formatter,
        help="convert a PipeDream graph.txt profile into a PipeStudio profile",
        description="Convert a layer profile written by PipeDream's profiler (graph.txt) into a "
        "PipeStudio profile,\nkeeping the graph's edges and a topological order.",
    )
    parser.add_argument("graph", metavar="GRAPH", help="path to graph.txt")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1,
        metavar="B",
        help="the minibatch size the file was profiled at; it becomes the "
        "profile's micro-batch size (default 1: the file's minibatch is "
        "one micro-batch)",
    )
    parser.add_argument("--model", help="model name (default: the folder holding GRAPH)")
    parser.add_argument(
        "-o",
        "--output",
        metavar="PROFILE",
        help="where to write the profile JSON (default: stdout)",
    )
    parser.set_defaults(handler=_import_pipedream)


def _import_pipedream(args: argparse.Namespace) -> int:
    profile = import_pipedream(args.graph, batch_size=args.batch_size, model=args.model)
    write_document(profile, args.output)
    return 0


def _add_plan_template(commands: Any) -> None:
    parser = commands.add_parser(
        "plan-template",
        formatter_class=_Formatter,
        help="write a plan with equal layer counts per stage, every layer kept",
        description="Write a starting plan: K stages with equal layer counts (the first ones "
        "take one more\nwhen K does not divide the layer count), one replica each, "
        "every layer's policy `keep`.",
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile JSON")
    parser.add_argument("--stages", type=int, required=True, metavar="K")
    parser.add_argument(
        "--microbatches", type=int, required=True, metavar="M", help="micro-batches per step"
    )
    parser.add_argument("--schedule", required=True, choices=SCHEDULES)
    parser.add_argument(
        "--virtual-stages",
        type=int,
        default=1,
        metavar="V",
        help="chunks per device (interleaved-1f1b): K x V stages, chunk c on device c mod K",
    )
    parser.add_argument(
        "--microbatch-size",
        type=int,
        metavar="N",
        help="samples per micro-batch (default: the profile's)",
    )
    parser.add_argument(
        "--optimizer",
        default="adam",
        choices=("sgd", "momentum", "adam"),
        help="optimizer whose state is counted in memory (default adam)",
    )
    add_precision_option(parser)
    parser.add_argument("-o", "--output", metavar="PLAN", help="plan JSON (default: stdout)")
    parser.set_defaults(handler=_plan_template)


def _plan_template(args: argparse.Namespace) -> int:
    profile = load_document(Profile, args.profile)
    if args.precision is not None:
        check_precision(args.precision, profile.precision, "--precision")
    plan = plan_template(
        profile,
        args.stages,
        args.microbatches,
        args.schedule,
        microbatch_size=args.microbatch_size,
        optimizer=args.optimizer,
        virtual_stages=args.virtual_stages,
    )
    write_document(plan, args.output)
    return 0


def add_precision_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="the precision to plan for, which must be the profile's (the "
        "default): the profile's times hold for it alone",
    )


def _add_cluster_template(commands: Any) -> None:
    parser = commands.add_parser(
        "cluster-template",
        formatter_class=_Formatter,
        help="write a homogeneous cluster description",
        description="Write a cluster of identical devices. Levels go innermost first, as in "
        "PipeDream:\n`--devices 8,2 --bandwidth-gbps 400,100` is 2 servers of 8 "
        "devices, 400 Gbit/s\nbetween devices of one server and 100 Gbit/s between "
        "servers.",
    )
    parser.add_argument(
        "--devices",
        required=True,
        metavar="N[,N2...]",
        help="members per group at each level, innermost first",
    )
    parser.add_argument(
        "--bandwidth-gbps",
        required=True,
        metavar="B[,B2...]",
        help="link bandwidth at each level in Gbit/s, innermost first",
    )
    parser.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="memory per device, like 16GiB or 80GB (default: unlimited)",
    )
    parser.add_argument(
        "--host-bandwidth-gbps",
        type=float,
        metavar="H",
        help="device<->host bandwidth for swap, each direction (default: free)",
    )
    parser.add_argument("--name", default="cluster", help="cluster name")
    parser.add_argument("-o", "--output", metavar="CLUSTER", help="cluster JSON (default: stdout)")
    parser.set_defaults(handler=_cluster_template)


def _cluster_template(args: argparse.Namespace) -> int:
    devices = _number_list(args.devices, int, "--devices")
    bandwidths = _number_list(args.bandwidth_gbps, float, "--bandwidth-gbps")
    memory = parse_size(args.device_memory) if args.device_memory else None
    cluster = cluster_template(
        devices,
        bandwidths,
        device_memory_bytes=memory,
        host_bandwidth_gbps=args.host_bandwidth_gbps,
        name=args.name,
    )
    write_document(cluster, args.output)
    return 0


def _number_list(text: str, kind: type, option: str) -> list[Any]:
    try:
        return [kind(item) for item in text.split(",")]
    except ValueError:
        raise PlannerError(
            f"{option} {text!r} must be a comma-separated list of "
            f"{'integers' if kind is int else 'numbers'}"
        ) from None


def _add_simulate(commands: Any) -> None:
    parser = commands.add_parser(
        "simulate",
        formatter_class=_Formatter,
        help="predict a plan's step time, memory and timeline",
        description="Simulate a plan step by step on every stage: forward, backward, recompute,"
        "\ntransfers, swap, all-reduce and update. Without --cluster, links are "
        "free and\nmemory is unlimited. A plan whose micro-batch size differs from "
        "the profile's\nuses the profile rescaled to it.",
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile JSON")
    parser.add_argument("plan", metavar="PLAN", help="plan JSON")
    parser.add_argument("--cluster", metavar="CLUSTER", help="cluster JSON")
    parser.add_argument(
        "--steps",
        type=int,
        default=1,
        metavar="N",
        help="steps to simulate and average (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the SimResult JSON")
    parser.add_argument(
        "--no-timeline",
        action="store_true",
        help="leave the timeline and memory tracks out of the JSON",
    )
    parser.add_argument(
        "--trace",
        metavar="FILE",
        help="write the timeline as a Chrome trace (Perfetto, chrome://tracing)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        metavar="T",
        help="each device's peak TFLOP/s in the plan's precision, for the "
        "model FLOP utilisation (default: the table of known GPUs, "
        "matched by the profile's device)",
    )
    parser.set_defaults(handler=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    profile = load_document(Profile, args.profile)
    plan = load_document(Plan, args.plan)
    cluster = load_document(Cluster, args.cluster) if args.cluster else None
    result = simulate(
        profile,
        plan,
        cluster,
        num_steps=args.steps,
        with_timeline=bool(args.trace) or not args.no_timeline,
    )
    if args.peak_tflops is not None:
        if not args.peak_tflops > 0:
            raise PlannerError(f"--peak-tflops must be > 0, got {args.peak_tflops}")
        result = result.model_copy(
            update={
                "mfu": model_flop_utilisation(
                    result.model_tflops, plan.num_workers, args.peak_tflops
                )
                if result.model_flops
                else None
            }
        )
    if args.trace:
        write_chrome_trace(result, args.trace)
        print(f"wrote {args.trace}", file=sys.stderr)
    if args.json:
        if args.no_timeline:
            result = result.model_copy(update={"timeline": [], "memory_timeline": []})
        print(result.to_json())
    else:
        print(describe_result(result, plan))
    return 0


def describe_result(result: SimResult, plan: Plan) -> str:
    """A human summary: the headline numbers and one row per stage."""
    header = (
        f"{result.model}: {result.schedule}, {result.num_stages} stages, "
        f"{result.num_microbatches} micro-batches of {result.microbatch_size}, "
        f"{plan.optimizer}, {plan.precision}"
    )
    totals = (
        f"step time {result.step_time_ms:.3f} ms   samples/s {result.samples_per_s:.1f}   "
        f"bubble {100 * result.bubble_fraction:.1f}%   "
        f"fits: {'yes' if result.fits else 'NO'}"
    )
    if result.model_flops:
        totals += (
            f"   model {result.model_flops / 1e9:.1f} GFLOP/step, {result.model_tflops:.3g} TFLOP/s"
        )
        if result.mfu is not None:
            totals += f" (MFU {100 * result.mfu:.1f}%)"
    rows = []
    for stage in result.stages:
        names = stage.layers
        span = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
        limit = (
            "-" if stage.device_memory_bytes is None else format_bytes(stage.device_memory_bytes)
        )
        rows.append(
            [
                str(stage.index),
                f"{span} ({len(names)})",
                str(stage.replicas),
                f"{stage.busy_ms:.3f}",
                format_bytes(stage.peak_bytes),
                limit,
                "yes" if stage.fits else "NO",
                str(stage.max_inflight_microbatches),
            ]
        )
    table = format_table(
        [
            "stage",
            "layers",
            "replicas",
            "busy ms",
            "peak memory",
            "device memory",
            "fits",
            "in flight",
        ],
        rows,
        right=[True, False, True, True, True, True, False, True],
    )
    return "\n".join([header, totals, "", table])


def _add_schema(commands: Any) -> None:
    parser = commands.add_parser(
        "schema",
        help="print the JSON Schema of a document format",
        description="Print the JSON Schema of one of the documents PipeStudio exchanges.",
    )
    parser.add_argument(
        "name",
        metavar="NAME",
        choices=sorted(DOCUMENTS),
        help=f"one of: {', '.join(sorted(DOCUMENTS))}",
    )
    parser.set_defaults(handler=_schema)


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(args.name), indent=2))
    return 0


def _add_validate(commands: Any) -> None:
    parser = commands.add_parser(
        "validate",
        formatter_class=_Formatter,
        help="check a profile, cluster, plan or result document",
        description="Check a document against its format; the kind is read from its `format` "
        "field.\nWith --profile, a plan is also checked against that profile.",
    )
    parser.add_argument("document", metavar="FILE")
    parser.add_argument("--profile", metavar="PROFILE", help="profile a plan must fit")
    parser.set_defaults(handler=_validate)


def _validate(args: argparse.Namespace) -> int:
    try:
        raw = json.loads(Path(args.document).read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlannerError(f"cannot read {args.document}: {exc.strerror}") from None
    except ValueError as exc:
        raise PlannerError(f"{args.document} is not JSON: {exc}") from None
    kinds = {f"pipestudio.{name}": model for name, model in DOCUMENTS.items()}
    fmt = raw.get("format") if isinstance(raw, dict) else None
    if fmt not in kinds:
        raise PlannerError(
            f"{args.document}: unknown format {fmt!r}; expected one of {', '.join(sorted(kinds))}"
        )
    document = parse_document(kinds[fmt], raw, source=args.document)
    if args.profile and isinstance(document, Plan):
        resolve_plan(document, load_document(Profile, args.profile))
    print(f"{args.document}: valid {fmt} version {raw.get('version')}")
    return 0
