"""Commands that run PyTorch: profile (torch is imported only when one of them runs)."""

import argparse
from typing import Any

_Formatter = argparse.RawDescriptionHelpFormatter

#: The names in pipestudio.runtime.models.MODELS, spelled out so that ``--help`` does not
#: import torch (a test keeps the two equal).
BUILTIN_MODELS: tuple[str, ...] = ("dynamic", "gpt", "mlp", "resnet", "unet")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "profile", formatter_class=_Formatter,
        help="measure a model layer by layer and write its profile",
        description="Measure every layer of a model at one micro-batch size: forward and "
                    "backward time,\noptimizer update time, parameter, output and saved "
                    "bytes (and workspace on CUDA).\nTimes are medians of --repeats runs after "
                    "--warmup runs.\n\nBuilt-in models: " + ", ".join(BUILTIN_MODELS) + ". "
                    "Your own: MODULE:FACTORY or FILE.py:FACTORY,\na function returning a "
                    "pipestudio.runtime.models.ModelSpec (docs/runtime.md).\n\nexample:\n"
                    "  pipestudio profile --model gpt --model-arg layers=8 --microbatch-size 8 "
                    "-o gpt.json")
    parser.add_argument("--model", required=True, metavar="NAME|MODULE:FACTORY",
                        help="a built-in model or a factory to import")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a keyword argument of the model's factory, e.g. layers=8 "
                             "(repeatable)")
    parser.add_argument("--microbatch-size", type=int, required=True, metavar="N",
                        help="samples per micro-batch to measure at")
    parser.add_argument("--device", default="cpu", metavar="cpu|cuda[:N]",
                        help="device to measure on (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="dtype of parameters and activations (default float32)")
    parser.add_argument("--repeats", type=int, default=5, metavar="R",
                        help="timed runs per measurement; the median is kept (default 5)")
    parser.add_argument("--warmup", type=int, default=2, metavar="W",
                        help="untimed runs before them (default 2)")
    parser.add_argument("--threads", type=int, metavar="T",
                        help="CPU threads for torch (default: torch's own choice)")
    parser.add_argument("--optimizer", default="adam", choices=("sgd", "momentum", "adam"),
                        help="optimizer whose update is timed (default adam)")
    parser.add_argument("-o", "--output", metavar="PROFILE",
                        help="where to write the profile JSON (default: stdout)")
    parser.set_defaults(handler=_profile)


def _profile(args: argparse.Namespace) -> int:
    import torch

    from pipestudio.cli.output import write_document
    from pipestudio.runtime.devices import resolve_device
    from pipestudio.runtime.models import load_model, parse_model_args
    from pipestudio.runtime.profiler import profile_model

    device = resolve_device(args.device)
    spec = load_model(args.model, parse_model_args(args.model_arg))
    profile = profile_model(spec, args.microbatch_size, device, warmup=args.warmup,
                            repeats=args.repeats, dtype=getattr(torch, args.dtype),
                            optimizer=args.optimizer, threads=args.threads)
    write_document(profile, args.output)
    return 0
