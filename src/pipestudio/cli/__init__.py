"""The ``pipestudio`` command line: one subcommand per task, grouped by component."""

import argparse
import sys
from collections.abc import Sequence

from pipestudio import __version__
from pipestudio.cli import calibrate, documents, planners, replan, runtime, server
from pipestudio.planner.errors import PlannerError

DESCRIPTION = """\
PipeStudio plans and runs pipeline-parallel training of PyTorch models.

Typical use:
  pipestudio import-pipedream graph.txt --batch-size 128 -o profile.json
  pipestudio cluster-template --devices 4 --bandwidth-gbps 100 --device-memory 16GiB -o cluster.json
  pipestudio plan-template profile.json --stages 4 --microbatches 8 --schedule 1f1b -o plan.json
  pipestudio simulate profile.json plan.json --cluster cluster.json --trace trace.json

Times are in milliseconds, sizes in bytes, bandwidths in Gbit/s.
Run `pipestudio COMMAND --help` for the options of a command.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipestudio",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pipestudio {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    documents.add_commands(commands)
    planners.add_commands(commands)
    replan.add_commands(commands)
    calibrate.add_commands(commands)
    runtime.add_commands(commands)
    server.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.handler(args)
    except PlannerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
