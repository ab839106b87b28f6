"""The ``replan`` command: should a running plan be repartitioned for an observed profile?"""

import argparse
from typing import Any

from pipestudio.cli.output import format_table, write_document
from pipestudio.planner import Cluster, Plan, Profile, load_document
from pipestudio.planner.formats.proposal import Proposal
from pipestudio.planner.replan.online import ALGORITHMS, evaluate_replan
from pipestudio.planner.units import format_bytes

_Formatter = argparse.RawDescriptionHelpFormatter


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "replan",
        formatter_class=_Formatter,
        help="propose moving layers between stages after the layers' times drifted",
        description="Weigh repartitions of a running plan for the profile measured now: the "
        "exact optimum and\nvPipe's boundary-layer moves from the current stages, "
        "each simulated on the observed\nprofile, with the migration of the moved "
        "layers' state costed on the cluster. A move is\nworthwhile when it saves "
        "at least --min-gain of the step time and repays its migration\nwithin "
        "--payback-steps steps. Exits 0 either way; the verdict is in the output.",
    )
    parser.add_argument("plan", metavar="PLAN", help="the running plan JSON")
    parser.add_argument(
        "observed_profile",
        metavar="OBSERVED_PROFILE",
        help="profile JSON measured on the running job",
    )
    parser.add_argument(
        "--cluster", metavar="CLUSTER", help="cluster JSON (default: free links, unlimited memory)"
    )
    parser.add_argument(
        "--payback-steps",
        type=float,
        default=100,
        metavar="N",
        help="the gain must repay the migration within N steps (default 100)",
    )
    parser.add_argument(
        "--min-gain",
        type=float,
        default=0.02,
        metavar="F",
        help="least step time saved, as a fraction (default 0.02)",
    )
    parser.add_argument(
        "--algorithm",
        default="auto",
        choices=ALGORITHMS,
        help="candidates to weigh (default auto: every one that applies)",
    )
    parser.add_argument("-o", "--output", metavar="PROPOSAL", help="write the Proposal JSON here")
    parser.add_argument("--json", action="store_true", help="print the Proposal JSON")
    parser.set_defaults(handler=_replan)


def _replan(args: argparse.Namespace) -> int:
    plan = load_document(Plan, args.plan)
    profile = load_document(Profile, args.observed_profile)
    cluster = load_document(Cluster, args.cluster) if args.cluster else None
    proposal = evaluate_replan(
        plan,
        profile,
        cluster,
        payback_steps=args.payback_steps,
        min_gain_fraction=args.min_gain,
        algorithm=args.algorithm,
    )
    if args.output:
        write_document(proposal, args.output)
    if args.json:
        print(proposal.to_json())
    else:
        print(describe_proposal(proposal))
    return 0


def describe_proposal(proposal: Proposal) -> str:
    """The verdict, the step times, the migration and one row per moved layer."""
    verdict = "WORTHWHILE" if proposal.worthwhile else "not worthwhile"
    payback = "-" if proposal.payback_steps is None else f"{proposal.payback_steps:.1f} steps"
    lines = [
        f"{proposal.model}: {proposal.schedule}, {len(proposal.current_stages)} stages; "
        f"candidate {proposal.algorithm}: {verdict}",
        f"step time {proposal.step_time_now_ms:.3f} ms -> {proposal.step_time_after_ms:.3f} ms"
        f"   gain {proposal.gain_ms:.3f} ms ({100 * proposal.gain_fraction:.2f}%)",
        f"migration {format_bytes(proposal.migration_bytes)} in {proposal.migration_ms:.3f} ms"
        f"   payback {payback} (limit {proposal.hysteresis.max_payback_steps:g}, "
        f"min gain {100 * proposal.hysteresis.min_gain_fraction:.2f}%)",
        f"reason: {proposal.reason}",
    ]
    if proposal.moves:
        rows = [[move.layer, str(move.from_stage), str(move.to_stage)] for move in proposal.moves]
        lines += [
            "",
            format_table(["layer", "from stage", "to stage"], rows, right=[False, True, True]),
        ]
    if proposal.policy_changes:
        rows = [
            [change.layer, change.from_policy, change.to_policy]
            for change in proposal.policy_changes
        ]
        lines += ["", format_table(["layer", "policy now", "policy after"], rows)]
    return "\n".join(lines)
