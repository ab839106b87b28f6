"""Making plans with the planner package: by a planner, by hand, or from a document; and
simulating them. Every planner error is the user's input and becomes a 422."""

import itertools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from pipestudio.backend.errors import InputError
from pipestudio.backend.schemas.plans import (
    ByDocument,
    ByHand,
    ByPlanner,
    ManualPlan,
    PlannerParameters,
    PlannerRequest,
    PlanSource,
    PlanSummary,
)
from pipestudio.planner import (
    Cluster,
    Plan,
    PlannerError,
    Profile,
    SimResult,
    WorkBudgetError,
    simulate,
)
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.request import (
    PlanOutcome,
    PlanRequest,
    memory_only_cluster,
    run_planner,
)
from pipestudio.planner.algorithms.schedules import AUTO
from pipestudio.planner.formats.documents import parse_document
from pipestudio.planner.formats.plan import PLANNED_SCHEDULES, Schedule, resolve_plan

T = TypeVar("T")


def planner_request(
    profile: Profile, cluster: Cluster | None, params: PlannerParameters
) -> PlanRequest:
    if cluster is None and params.device_memory_bytes is not None:
        if params.num_stages is None:
            raise InputError(
                "num_stages", "device_memory_bytes needs num_stages (the number of devices)"
            )
        cluster = memory_only_cluster(params.num_stages, params.device_memory_bytes)
    if params.schedule not in (*PLANNED_SCHEDULES, AUTO):
        raise InputError(
            "schedule",
            f"the planners plan {', '.join(PLANNED_SCHEDULES)} (or choose with auto); make a "
            f"{params.schedule} plan by hand (manual) or from a document",
        )
    try:
        return PlanRequest(
            profile=profile,
            num_microbatches=params.num_microbatches,
            schedule=cast(Schedule, "1f1b" if params.schedule == AUTO else params.schedule),
            num_stages=params.num_stages,
            microbatch_size=params.microbatch_size,
            optimizer=params.optimizer,
            cluster=cluster,
            single_replica=params.straight,
        )
    except PlannerError as exc:
        raise InputError("num_stages", str(exc)) from None


def check_algorithm(name: str, field: str) -> None:
    if name not in PLANNERS:
        raise InputError(
            field, f"planner {name!r} is unknown; expected one of {', '.join(PLANNERS)}"
        )


def ask_planner(
    profile: Profile, cluster: Cluster | None, request: PlannerRequest, max_ops: int | None
) -> PlanOutcome:
    check_algorithm(request.algorithm, "planner.algorithm")
    return within_budget(
        lambda: run_planner(
            request.algorithm,
            PLANNERS[request.algorithm],
            planner_request(profile, cluster, request),
            with_timeline=False,
            max_ops=max_ops,
            auto=request.schedule == AUTO,
        ),
        "planner",
    )


def within_budget(work: Callable[[], T], where: str) -> T:
    """``work()``, its ``WorkBudgetError`` a 422 naming the field (under ``where``
    in the request) and the limit."""
    try:
        return work()
    except WorkBudgetError as exc:
        raise InputError(f"{where}.{exc.field}" if where else exc.field, str(exc)) from None


def manual_plan(
    profile: Profile,
    manual: ManualPlan,
    *,
    field: str = "manual",
    provenance: dict[str, Any] | None = None,
) -> Plan:
    """Stages cut at ``boundaries`` (layer indices where stages 1.. start)."""
    cuts = [0, *manual.boundaries, profile.num_layers]
    if any(b <= a for a, b in itertools.pairwise(cuts)):
        raise InputError(
            f"{field}.boundaries",
            f"boundaries {manual.boundaries} must rise strictly between 1 and "
            f"{profile.num_layers - 1} (the profile has {profile.num_layers} "
            "layers)",
        )
    names = [layer.name for layer in profile.layers]
    document = {
        "model": profile.model,
        "schedule": manual.schedule,
        "virtual_stages": manual.virtual_stages,
        "num_microbatches": manual.num_microbatches,
        "microbatch_size": manual.microbatch_size or profile.microbatch_size,
        "optimizer": manual.optimizer,
        "policies": manual.policies,
        "precision": profile.precision,
        "stages": [{"layers": names[a:b]} for a, b in itertools.pairwise(cuts)],
        "provenance": provenance or {"planner": "manual"},
    }
    return checked_plan(profile, document, f"{field}")


def checked_plan(profile: Profile, document: Plan | dict[str, Any], field: str) -> Plan:
    """``document`` as a Plan that places every layer of ``profile``."""
    try:
        plan = (
            document
            if isinstance(document, Plan)
            else parse_document(Plan, document, source="plan")
        )
        resolve_plan(plan, profile)
    except PlannerError as exc:
        raise InputError(field, str(exc)) from None
    return plan


def boundaries_of(plan: Plan, profile: Profile) -> list[int]:
    index = profile.layer_index
    return [min(index[name] for name in stage.layers) for stage in plan.stages[1:]]


def plan_from_source(
    profile: Profile, cluster: Cluster | None, source: PlanSource, author: str, max_ops: int | None
) -> tuple[Plan, str, dict[str, Any]]:
    """The plan a request describes, the planner that made it and its parameters."""
    if isinstance(source, ByPlanner):
        outcome = ask_planner(profile, cluster, source.planner, max_ops)
        if outcome.plan is None:
            raise InputError("planner", f"{source.planner.algorithm}: {outcome.error}")
        parameters = {
            **source.planner.model_dump(exclude={"algorithm"}),
            "planner_ms": outcome.planner_ms,
            "objective_ms": outcome.objective_ms,
        }
        plan = outcome.plan.model_copy(
            update={"provenance": {**outcome.plan.provenance, "author": author}}
        )
        return plan, source.planner.algorithm, parameters
    if isinstance(source, ByHand):
        plan = manual_plan(
            profile, source.manual, provenance={"planner": "manual", "author": author}
        )
        return plan, "manual", source.manual.model_dump()
    assert isinstance(source, ByDocument)
    plan = checked_plan(profile, source.plan, "plan")
    return plan, str(plan.provenance.get("planner", "document")), {}


def run_simulation(
    profile: Profile,
    plan: Plan,
    cluster: Cluster | None,
    *,
    steps: int = 2,
    with_timeline: bool = True,
    max_ops: int | None = None,
    where: str = "plan",
) -> SimResult:
    """The plan simulated; beyond ``max_ops`` operations, a 422 naming the field (under
    ``where`` in the request) and the limit."""
    try:
        return within_budget(
            lambda: simulate(
                profile,
                plan,
                cluster,
                num_steps=steps,
                with_timeline=with_timeline,
                max_ops=max_ops,
            ),
            where,
        )
    except PlannerError as exc:
        raise InputError(where, str(exc)) from None


def summarize(result: SimResult) -> PlanSummary:
    return PlanSummary(
        step_time_ms=result.step_time_ms,
        samples_per_s=result.samples_per_s,
        bubble_fraction=result.bubble_fraction,
        fits=result.fits,
        stage_busy_ms=[stage.busy_ms for stage in result.stages],
        stage_peak_bytes=[stage.peak_bytes for stage in result.stages],
        device_peak_bytes=result.device_peak_bytes,
        stage_device_memory_bytes=[stage.device_memory_bytes for stage in result.stages],
    )
