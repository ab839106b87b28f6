"""Commands that run PyTorch: profile, train (torch is imported only when one of them runs)."""

import argparse
import os
import sys
from typing import Any

from pipestudio.planner.formats.documents import PRECISIONS

_Formatter = argparse.RawDescriptionHelpFormatter

#: The names in pipestudio.runtime.models.MODELS, spelled out so that ``--help`` does not
#: import torch (a test keeps the two equal).
BUILTIN_MODELS: tuple[str, ...] = ("dynamic", "gpt", "mlp", "resnet", "unet")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
GRANULARITIES: tuple[str, ...] = ("layer", "op")
ON_NONFINITE_LOSS: tuple[str, ...] = ("fail", "continue")
#: fp16's loss scaling defaults (``runtime/engine/execution/scaling.py``'s, spelled out likewise).
INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "profile",
        formatter_class=_Formatter,
        help="measure a model layer by layer and write its profile",
        description="Measure every layer of a model at one micro-batch size: forward and "
        "backward time,\noptimizer update time, parameter, output and saved "
        "bytes (and workspace on CUDA).\nTimes are medians of --repeats runs after "
        "--warmup runs.\n\nBuilt-in models: " + ", ".join(BUILTIN_MODELS) + ". "
        "Your own: MODULE:FACTORY or FILE.py:FACTORY,\na function returning a "
        "pipestudio.runtime.models.ModelSpec (docs/runtime.md).\n\n"
        "--granularity op traces every layer with torch.fx and measures each tensor "
        "operator\n(block0.attn.qkv, block0.add...) as a layer, with edges, so "
        "planners can cut inside a\nlayer (DawnPiper); train such a plan with "
        "`pipestudio train --granularity op`.\n\nexamples:\n"
        "  pipestudio profile --model gpt --model-arg layers=8 --microbatch-size 8 "
        "-o gpt.json\n"
        "  pipestudio profile --model gpt --microbatch-size 8 --granularity op "
        "-o gpt-ops.json",
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="NAME|MODULE:FACTORY",
        help="a built-in model or a factory to import",
    )
    parser.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the model's factory, e.g. layers=8 (repeatable)",
    )
    parser.add_argument(
        "--microbatch-size",
        type=int,
        required=True,
        metavar="N",
        help="samples per micro-batch to measure at",
    )
    parser.add_argument(
        "--device", default="cpu", metavar="cpu|cuda[:N]", help="device to measure on (default cpu)"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="dtype of parameters and activations (default float32)",
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=PRECISIONS,
        help="arithmetic to measure in, as the plan will train: fp32 "
        "(default), tf32 (TF32 matmuls on CUDA), bf16 or fp16 (autocast "
        "over float32 weights)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        metavar="R",
        help="timed runs per measurement; the median is kept (default 5)",
    )
    parser.add_argument(
        "--warmup", type=int, default=2, metavar="W", help="untimed runs before them (default 2)"
    )
    threads = parser.add_mutually_exclusive_group()
    threads.add_argument(
        "--threads",
        type=int,
        metavar="T",
        help="CPU threads for torch (default: this host's cores / K of --ranks-per-host)",
    )
    threads.add_argument(
        "--ranks-per-host",
        type=int,
        default=1,
        metavar="K",
        help="ranks of the planned run that will share this host's cores; "
        "measure with the threads each will get, cores / K, as "
        "`pipestudio train` and the workers give them (default 1)",
    )
    parser.add_argument(
        "--optimizer",
        default="adam",
        choices=("sgd", "momentum", "adam"),
        help="optimizer whose update is timed (default adam)",
    )
    parser.add_argument(
        "--granularity",
        default="layer",
        choices=GRANULARITIES,
        help="layer: the model's layers (default); op: every tensor operator of a torch.fx trace",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="PROFILE",
        help="where to write the profile JSON (default: stdout)",
    )
    parser.set_defaults(handler=_profile)
    _add_train(commands)


def _profile(args: argparse.Namespace) -> int:
    import torch

    from pipestudio.cli.output import write_document
    from pipestudio.runtime.devices import resolve_device
    from pipestudio.runtime.engine.rank import default_threads
    from pipestudio.runtime.models import load_model, parse_model_args
    from pipestudio.runtime.profiler import SettingsError, profile_model

    device = resolve_device(args.device)
    if args.ranks_per_host < 1:
        raise SettingsError(f"--ranks-per-host must be >= 1, got {args.ranks_per_host}")
    threads = args.threads if args.threads is not None else default_threads(args.ranks_per_host)
    spec = load_model(args.model, parse_model_args(args.model_arg))
    profile = profile_model(
        spec,
        args.microbatch_size,
        device,
        warmup=args.warmup,
        repeats=args.repeats,
        dtype=getattr(torch, args.dtype),
        optimizer=args.optimizer,
        threads=threads,
        granularity=args.granularity,
        precision=args.precision,
    )
    write_document(profile, args.output)
    return 0


_TRAIN_HELP = """\
Train a model with a plan: one process per stage replica on this machine (rank order:
stage 0's replicas, then stage 1's...), or, under torchrun (RANK and WORLD_SIZE set), as
one rank of a job torchrun started. gloo on CPU, NCCL between GPUs. A plan made from an
operator-level profile (profile --granularity op) needs --granularity op here.

examples:
  pipestudio plan-template mlp.json --stages 2 --microbatches 4 --schedule 1f1b -o plan.json
  pipestudio train --plan plan.json --model mlp --steps 20 --metrics m.jsonl --trace t.json
  torchrun --standalone --nproc-per-node 2 -m pipestudio train --plan plan.json --model mlp \\
      --steps 20
  pipestudio train --plan ops-plan.json --model gpt --steps 20 --granularity op
  pipestudio train --plan plan.json --model resnet --steps 20 --deferred-batchnorm
"""


def _add_train(commands: Any) -> None:
    parser = commands.add_parser(
        "train",
        formatter_class=_Formatter,
        description=_TRAIN_HELP,
        help="train a model with a plan on pipeline workers (torch.distributed)",
    )
    parser.add_argument("--plan", required=True, metavar="PLAN", help="the plan JSON")
    parser.add_argument(
        "--model",
        required=True,
        metavar="NAME|MODULE:FACTORY",
        help="a built-in model or a factory to import",
    )
    parser.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the model's factory (repeatable)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        required=True,
        metavar="N",
        help="train until step N (counted from the start when resuming)",
    )
    parser.add_argument(
        "--lr",
        type=float,
        metavar="LR",
        help="learning rate (default: the optimizer's, 0.01 sgd, 1e-3 adam)",
    )
    parser.add_argument(
        "--threads-per-rank",
        type=int,
        metavar="T",
        help="torch CPU threads per process (default: cores / processes)",
    )
    parser.add_argument("--metrics", metavar="FILE.jsonl", help="append every event here")
    parser.add_argument(
        "--trace", metavar="FILE.json", help="write a Chrome trace of the measured timeline"
    )
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="save checkpoints here")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="K",
        help="save every K steps as well as at the end (default: at the end)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --checkpoint-dir",
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help="the model factory's seed and torch's (default: the factory's)",
    )
    parser.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="auto: CUDA when available (default)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="longest wait for a peer before the job fails (default 20)",
    )
    parser.add_argument(
        "--interface",
        metavar="NAME",
        help="network interface of the ranks' gloo and NCCL connections (default: "
        "PIPESTUDIO_NETWORK_INTERFACE, else the one on the route to MASTER_ADDR; "
        "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, when set, win)",
    )
    parser.add_argument(
        "--granularity",
        default="layer",
        choices=GRANULARITIES,
        help="op: the plan's layers are tensor operators, from a profile made "
        "with --granularity op (default: layer)",
    )
    parser.add_argument(
        "--deferred-batchnorm",
        action="store_true",
        help="BatchNorm running statistics over all micro-batches of a step, "
        "as training on the whole mini-batch (torchgpipe); default: "
        "updated per micro-batch",
    )
    parser.add_argument(
        "--on-nonfinite-loss",
        default="fail",
        choices=ON_NONFINITE_LOSS,
        help="fail: end the job at the first step whose loss is NaN or "
        "infinite, naming the step and stage (default); continue: "
        "train on",
    )
    parser.add_argument(
        "--loss-scale",
        type=float,
        default=INIT_SCALE,
        metavar="S",
        help="fp16 plans: the dynamic loss scale to start from (default "
        f"{INIT_SCALE:g}); it halves at each overflow",
    )
    parser.add_argument(
        "--loss-scale-growth-interval",
        type=int,
        default=GROWTH_INTERVAL,
        metavar="N",
        help="fp16 plans: double the loss scale after N steps "
        f"without an overflow (default {GROWTH_INTERVAL})",
    )
    _add_repartition(parser)
    parser.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from pipestudio.planner import Plan, load_document
    from pipestudio.runtime.engine import EngineConfig, launch, train_from_env
    from pipestudio.runtime.engine.network import (
        INTERFACE_VARIABLE,
        InterfaceError,
        check_interface,
    )
    from pipestudio.runtime.engine.rank import exit_now
    from pipestudio.runtime.models import parse_model_args

    config = EngineConfig(
        plan=load_document(Plan, args.plan),
        model=args.model,
        model_args=parse_model_args(args.model_arg),
        steps=args.steps,
        lr=args.lr,
        threads_per_rank=args.threads_per_rank,
        metrics_path=args.metrics,
        trace_path=args.trace,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        seed=args.seed,
        device=args.device,
        timeout_s=args.timeout,
        granularity=args.granularity,
        deferred_batchnorm=args.deferred_batchnorm,
        on_nonfinite_loss=args.on_nonfinite_loss,
        loss_scale=args.loss_scale,
        loss_scale_growth_interval=args.loss_scale_growth_interval,
        migration=_repartition(args),
    )
    config.check()
    if args.interface:
        try:
            os.environ[INTERFACE_VARIABLE] = check_interface(args.interface)
        except InterfaceError as exc:
            print(f"error: --interface: {exc}", file=sys.stderr)
            return 2
    last_stage = config.plan.num_stages - 1

    def progress(event: dict[str, Any]) -> None:
        if event["type"] == "step" and event["stage"] == last_stage and event["replica"] == 0:
            scale = (
                ""
                if "loss_scale" not in event
                else f", loss scale {event['loss_scale']:g}"
                + (", overflow: update skipped" if event["overflowed"] else "")
            )
            print(
                f"step {event['step']}: loss {event.get('loss', float('nan')):.4f} "
                f"({event['end_ms'] - event['start_ms']:.1f} ms on the last stage{scale})",
                file=sys.stderr,
            )

    if "RANK" in os.environ:  # this process is the rank: end it as the engine's ranks end
        exit_now(_report(train_from_env(config, progress), args))
    return _report(launch(config, progress), args)


def _report(result: Any, args: argparse.Namespace) -> int:
    if not result.ok:
        for line in result.message.splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 1
    if result.summary is not None:
        summary = result.summary
        print(
            f"trained steps {summary['steps'][0] if summary['steps'] else args.steps}.."
            f"{args.steps - 1}: {summary['step_time_ms']:.1f} ms/step, "
            f"{summary['samples_per_s']:.1f} samples/s, bubble "
            f"{summary['bubble_fraction']:.0%}",
            file=sys.stderr,
        )
        for path in (args.metrics, args.trace):
            if path:
                print(f"wrote {path}", file=sys.stderr)
    return 0


def _add_repartition(parser: Any) -> None:
    group = parser.add_argument_group("live repartition (docs/runtime.md)")
    group.add_argument(
        "--migrate",
        action="append",
        default=[],
        metavar="STEP:LAYER@STAGE,..",
        help="move layers so that step STEP runs on the new partition, e.g. "
        "4:block2@1,block5@3 (repeatable)",
    )
    group.add_argument(
        "--repartition-every",
        type=int,
        default=0,
        metavar="N",
        help="run the online planner on every N steps' measurements",
    )
    mode = group.add_mutually_exclusive_group()
    mode.add_argument(
        "--auto-repartition", action="store_true", help="apply worthwhile proposals at once"
    )
    mode.add_argument(
        "--hold-proposals",
        action="store_true",
        help="hold proposals for approval through --control-dir (default)",
    )
    group.add_argument(
        "--control-dir",
        metavar="DIR",
        help="command channel: commands/, status/, proposals/ (JSON files)",
    )
    group.add_argument(
        "--min-gain",
        type=float,
        default=0.05,
        metavar="FRACTION",
        help="least step-time gain a proposal must bring (default 0.05)",
    )
    group.add_argument(
        "--replan-cluster",
        metavar="CLUSTER",
        help="cluster JSON the online planner simulates on (default: none)",
    )


def _repartition(args: argparse.Namespace) -> Any:
    from pipestudio.runtime.engine.migration.settings import MigrationSettings, parse_migration

    return MigrationSettings(
        migrations=[parse_migration(text) for text in args.migrate],
        control_dir=args.control_dir,
        every=args.repartition_every,
        auto=args.auto_repartition,
        min_gain_fraction=args.min_gain,
        cluster_path=args.replan_cluster,
    )
