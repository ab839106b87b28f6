"""Online replanning: whether and how to repartition a running job whose layers drifted.

A job runs a plan made for one profile; the engine measures what its layers really take (a
layer grew, a stage is slower than predicted, a dynamic or NAS model switched layers on) and
hands over an observed profile. vPipe (Zhao et al., TPDS'22) answers such drift by
re-partitioning online and migrating boundary layers between stages. Here:

1. the current plan and every candidate (``candidates.py``: the exact optimum, and
   vPipe's refinements from the current cut points) are simulated on the observed profile
   and the cluster; candidates that do not fit device memory are dropped;
2. each candidate's migration is costed (``migration.py``) and it is ranked by its net gain
   per step, ``gain_ms - migration_ms / payback_steps``: the migration amortised over the
   steps it must pay back within. Ties (to the nanosecond) go to fewer bytes moved, then
   to fewer moves, then to fewer policy changes;
3. hysteresis: a candidate is worthwhile only when its gain repays the migration within
   ``payback_steps`` steps AND it saves at least ``min_gain_fraction`` of the step time.
   The second condition is what stops flip-flopping: a prediction noisy by a few per cent
   would otherwise propose a move, then the move back at the next measurement. With a
   threshold above the noise neither direction passes.

The best worthwhile candidate is proposed; when none is, the evaluation still reports the
best faster candidate and why it was refused (``evaluate_replan``, for the UI).
"""

import math
from dataclasses import dataclass
from typing import Literal, get_args

from pipestudio.planner.algorithms.request import PlanRequest
from pipestudio.planner.errors import PlanError
from pipestudio.planner.formats.cluster import Cluster
from pipestudio.planner.formats.plan import Plan
from pipestudio.planner.formats.profile import Profile
from pipestudio.planner.formats.proposal import CandidateSummary, Hysteresis, PolicyChange, Proposal
from pipestudio.planner.replan.candidates import (
    Candidate,
    optimal_candidate,
    plan_request,
    refinements,
)
from pipestudio.planner.replan.migration import Migration, plan_migration
from pipestudio.planner.simulator.simulate import simulate
from pipestudio.planner.units import format_bytes

#: ``auto`` weighs every candidate that applies; the others restrict the search.
#: How the online planner searches: ``optimal``, ``refine`` (moves from the current plan), or
#: ``auto`` (both).
Algorithm = Literal["auto", "optimal", "refine"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)


class ReplanError(PlanError):
    """The plan and the observed profile do not belong together, or a setting is invalid."""


@dataclass(frozen=True)
class _Scored:
    """A candidate simulated on the observed profile, with its migration."""

    candidate: Candidate
    plan: Plan
    step_time_ms: float
    fits: bool
    migration: Migration
    policy_changes: list[PolicyChange]
    gain_ms: float
    gain_fraction: float
    net_gain_ms: float

    @property
    def changes_nothing(self) -> bool:
        return not self.migration.moves and not self.policy_changes


def replan(
    plan: Plan,
    observed_profile: Profile,
    cluster: Cluster | None = None,
    *,
    payback_steps: float = 100,
    min_gain_fraction: float = 0.02,
    algorithm: Algorithm = "auto",
    num_steps: int = 1,
) -> Proposal | None:
    """A worthwhile repartition of ``plan`` for ``observed_profile``, or None (module
    docstring)."""
    proposal = evaluate_replan(
        plan,
        observed_profile,
        cluster,
        payback_steps=payback_steps,
        min_gain_fraction=min_gain_fraction,
        algorithm=algorithm,
        num_steps=num_steps,
    )
    return proposal if proposal.worthwhile else None


def evaluate_replan(
    plan: Plan,
    observed_profile: Profile,
    cluster: Cluster | None = None,
    *,
    payback_steps: float = 100,
    min_gain_fraction: float = 0.02,
    algorithm: Algorithm = "auto",
    num_steps: int = 1,
) -> Proposal:
    """The best repartition found and its verdict, worthwhile or not (``reason`` says)."""
    hysteresis = _hysteresis(payback_steps, min_gain_fraction, algorithm)
    check_observed_profile(plan, observed_profile)
    now = simulate(observed_profile, plan, cluster, num_steps=num_steps, with_timeline=False)
    request = plan_request(plan, observed_profile, cluster)
    scored: list[_Scored] = []
    summaries: list[CandidateSummary] = []
    for candidate in _candidates(plan, request, algorithm):
        if candidate.plan is None:
            summaries.append(CandidateSummary(name=candidate.name, note=candidate.note))
            continue
        item = _score(
            candidate, plan, observed_profile, cluster, now.step_time_ms, hysteresis, num_steps
        )
        scored.append(item)
        summaries.append(_summary(item))
    chosen, worthwhile, reason = _choose(scored, hysteresis, now.fits)
    if chosen is None:
        chosen = _score(
            Candidate("current", plan),
            plan,
            observed_profile,
            cluster,
            now.step_time_ms,
            hysteresis,
            num_steps,
        )
    return _proposal(
        plan, chosen, now.step_time_ms, hysteresis, num_steps, worthwhile, reason, summaries
    )


def check_observed_profile(plan: Plan, profile: Profile) -> None:
    """The profile must be of the plan's model and have exactly the layers it places."""
    if plan.model != profile.model:
        raise ReplanError(
            f"the observed profile is of model {profile.model!r} but the plan is for {plan.model!r}"
        )
    placed = [name for stage in plan.stages for name in stage.layers]
    measured = profile.layer_index
    missing = [name for name in placed if name not in measured]
    if missing:
        raise ReplanError(
            f"the observed profile lacks {_some(missing)} that the plan "
            "places; measure every layer of the running model"
        )
    placed_names = set(placed)
    unplaced = [name for name in measured if name not in placed_names]
    if unplaced:
        raise ReplanError(
            f"the observed profile has {_some(unplaced)} that no stage of the "
            "plan holds; a plan that places them must be made first"
        )


def _some(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:5])
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return f"{len(names)} layer{'s' if len(names) > 1 else ''} ({shown}{more})"


def _hysteresis(payback_steps: float, min_gain_fraction: float, algorithm: Algorithm) -> Hysteresis:
    if not (payback_steps > 0 and math.isfinite(payback_steps)):
        raise ReplanError(f"payback steps must be a positive number, got {payback_steps}")
    if not 0 <= min_gain_fraction < 1:
        raise ReplanError(f"the minimum gain must be a fraction in [0, 1), got {min_gain_fraction}")
    if algorithm not in ALGORITHMS:
        raise ReplanError(
            f"replan algorithm {algorithm!r} is unknown; expected one of {', '.join(ALGORITHMS)}"
        )
    return Hysteresis(max_payback_steps=payback_steps, min_gain_fraction=min_gain_fraction)


def _candidates(plan: Plan, request: PlanRequest, algorithm: Algorithm) -> list[Candidate]:
    """The candidates ``algorithm`` asks for; the optimum only for straight plans."""
    replicated = [idx for idx, stage in enumerate(plan.stages) if stage.replicas > 1]
    result: list[Candidate] = []
    if algorithm in ("auto", "refine"):  # first: ties go to the local moves
        found = refinements(plan, request)
        if algorithm == "refine" and found[0].plan is None:
            raise ReplanError(f"algorithm 'refine' cannot start from this plan: {found[0].note}")
        result.extend(found)
    if algorithm in ("auto", "optimal"):
        if not replicated:
            result.append(optimal_candidate(plan, request))
        elif algorithm == "optimal":
            raise ReplanError(
                f"algorithm 'optimal' plans one replica per stage but stage "
                f"{replicated[0]} has {plan.stages[replicated[0]].replicas}; "
                "use 'refine' or 'auto'"
            )
        else:
            result.append(Candidate("optimal", None, "the plan has replicated stages"))
    return result


def _score(
    candidate: Candidate,
    plan: Plan,
    profile: Profile,
    cluster: Cluster | None,
    now_ms: float,
    hysteresis: Hysteresis,
    num_steps: int,
) -> _Scored:
    new = candidate.plan
    assert new is not None
    result = simulate(profile, new, cluster, num_steps=num_steps, with_timeline=False)
    migration = plan_migration(profile, plan, new, cluster)
    changes = [
        PolicyChange(
            layer=layer.name, from_policy=plan.policy(layer.name), to_policy=new.policy(layer.name)
        )
        for layer in profile.layers
        if plan.policy(layer.name) != new.policy(layer.name)
    ]
    gain = now_ms - result.step_time_ms
    return _Scored(
        candidate,
        new,
        result.step_time_ms,
        result.fits,
        migration,
        changes,
        gain,
        gain / now_ms if now_ms > 0 else 0.0,
        gain - migration.duration_ms / hysteresis.max_payback_steps,
    )


def _summary(item: _Scored) -> CandidateSummary:
    note = (
        "does not fit device memory"
        if not item.fits
        else "same as the current plan"
        if item.changes_nothing
        else ""
    )
    return CandidateSummary(
        name=item.candidate.name,
        step_time_ms=item.step_time_ms,
        gain_ms=item.gain_ms,
        migration_bytes=item.migration.total_bytes,
        migration_ms=item.migration.duration_ms,
        net_gain_ms=item.net_gain_ms,
        num_moves=len(item.migration.moves),
        note=note,
    )


def _passes(item: _Scored, hysteresis: Hysteresis) -> bool:
    return (
        item.gain_fraction >= hysteresis.min_gain_fraction
        and item.migration.duration_ms <= item.gain_ms * hysteresis.max_payback_steps
    )


def _choose(
    scored: list[_Scored], hysteresis: Hysteresis, current_fits: bool
) -> tuple[_Scored | None, bool, str]:
    """(the candidate to report, whether it is worthwhile, why) (module docstring)."""
    faster = [
        item for item in scored if item.fits and item.gain_ms > 0 and not item.changes_nothing
    ]
    if not faster:
        memory = "" if current_fits else "; the current plan does not fit device memory"
        return (
            None,
            False,
            (f"no candidate is faster than the current plan on the observed profile{memory}"),
        )
    passing = [item for item in faster if _passes(item, hysteresis)]
    best = min(
        passing or faster,
        key=lambda item: (
            -round(item.net_gain_ms, 6),
            item.migration.total_bytes,
            len(item.migration.moves),
            len(item.policy_changes),
        ),
    )
    return best, bool(passing), _reason(best, hysteresis, bool(passing))


def _reason(item: _Scored, hysteresis: Hysteresis, worthwhile: bool) -> str:
    moved = len(item.migration.moves)
    what = (
        f"moving {moved} layer{'s' if moved != 1 else ''} "
        f"({format_bytes(item.migration.total_bytes)}, "
        f"{item.migration.duration_ms:.3f} ms to migrate)"
        if moved
        else f"changing {len(item.policy_changes)} memory policies (nothing to migrate)"
    )
    gain = f"saves {item.gain_ms:.3f} ms per step ({100 * item.gain_fraction:.2f}%)"
    payback = item.migration.duration_ms / item.gain_ms
    if worthwhile:
        return (
            f"{item.candidate.name}: {what} {gain} and pays back in {payback:.1f} steps "
            f"(limit {hysteresis.max_payback_steps:g})"
        )
    if item.gain_fraction < hysteresis.min_gain_fraction:
        return (
            f"{item.candidate.name}: {what} {gain}, less than the minimum gain of "
            f"{100 * hysteresis.min_gain_fraction:.2f}%"
        )
    return (
        f"{item.candidate.name}: {what} {gain} but pays back only after {payback:.1f} "
        f"steps, more than the limit of {hysteresis.max_payback_steps:g}"
    )


def _proposal(
    plan: Plan,
    chosen: _Scored,
    now_ms: float,
    hysteresis: Hysteresis,
    num_steps: int,
    worthwhile: bool,
    reason: str,
    summaries: list[CandidateSummary],
) -> Proposal:
    migration = chosen.migration
    return Proposal(
        model=plan.model,
        schedule=plan.schedule,
        algorithm=chosen.candidate.name,
        current_stages=plan.stages,
        new_plan=chosen.plan,
        moves=migration.moves,
        policy_changes=chosen.policy_changes,
        step_time_now_ms=now_ms,
        step_time_after_ms=chosen.step_time_ms,
        gain_ms=chosen.gain_ms,
        gain_fraction=chosen.gain_fraction,
        migration_bytes=migration.total_bytes,
        migration_breakdown=migration.breakdown,
        transfers=migration.transfers,
        migration_ms=migration.duration_ms,
        payback_steps=migration.duration_ms / chosen.gain_ms if chosen.gain_ms > 0 else None,
        hysteresis=hysteresis,
        simulated_steps=num_steps,
        worthwhile=worthwhile,
        reason=reason,
        candidates=summaries,
    )
