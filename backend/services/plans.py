"""Plans in the store: create, edit while draft, approve, simulate, compare.

States: ``draft`` (editable) -> ``approved`` (may be launched; back to draft to edit) ->
``launched`` (a run used it; frozen). Provenance: the planner, its parameters, who.

Approving checks that the plan can run as planned: that it fits its cluster's memory (its
simulation's peaks), and that its ranks are no more than its cluster's devices and the
slots of the online workers; any of these fails the approval with a 422 that names every
problem, unless ``force`` says the person saw them.

Every call that simulates or plans takes ``max_ops``, the work budget of one request
(``PIPESTUDIO_MAX_SIMULATED_OPS``): beyond it, a 422 names the field and the limit.
"""

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import ConflictError, InputError
from pipestudio.backend.repositories import Clusters, Plans, Profiles, Runs, Workers
from pipestudio.backend.schemas.plans import (
    AnyPlanCreate,
    AnyPreviewRequest,
    CompareRequest,
    CompareRow,
    ManualPlan,
    PlanFromDocument,
    PlanUpdate,
)
from pipestudio.backend.services import planning
from pipestudio.planner import Cluster, Plan, Profile, SimResult
from pipestudio.planner.algorithms import PLANNERS
from pipestudio.planner.algorithms.request import check_request_budget, run_planner
from pipestudio.planner.algorithms.schedules import AUTO


def documents(
    session: Session, profile_id: int, cluster_id: int | None
) -> tuple[Profile, Cluster | None]:
    """The profile and cluster a plan is made on, their rows held (``for_share``) until the
    plan is stored: a change or deletion of either waits, then sees the plan (409)."""
    profile = Profile.model_validate(Profiles(session).get(profile_id, for_share=True).document)
    cluster = (
        None
        if cluster_id is None
        else Cluster.model_validate(Clusters(session).get(cluster_id, for_share=True).document)
    )
    return profile, cluster


def _store(
    session: Session,
    row: models.Plan,
    plan: Plan,
    profile: Profile,
    cluster: Cluster | None,
    max_ops: int | None,
) -> models.Plan:
    result = planning.run_simulation(profile, plan, cluster, with_timeline=False, max_ops=max_ops)
    row.document = plan.model_dump(mode="json")
    row.precision = plan.precision
    row.summary = planning.summarize(result).model_dump()
    row.updated_at = models.utcnow()
    return Plans(session).add(row)


def create_plan(session: Session, data: AnyPlanCreate, max_ops: int | None) -> models.Plan:
    """Store the plan ``data`` describes, simulated, as a draft."""
    profile, cluster = documents(session, data.profile_id, data.cluster_id)
    plan, planner, parameters = planning.plan_from_source(
        profile, cluster, data, data.author, max_ops
    )
    row = models.Plan(
        name=data.name or f"{profile.model} {planner} {plan.num_stages} stages",
        profile_id=data.profile_id,
        cluster_id=data.cluster_id,
        state="draft",
        planner=planner,
        parameters=parameters,
        created_by=data.author,
        document={},
    )
    return _store(session, row, plan, profile, cluster, max_ops)


def _edited(plan: Plan, profile: Profile, data: PlanUpdate) -> Plan | None:
    if data.plan is not None:
        return planning.checked_plan(profile, data.plan, "plan")
    shape = ("boundaries", "policies", "num_microbatches", "schedule", "microbatch_size")
    if all(getattr(data, field) is None for field in shape):
        return None
    manual = ManualPlan(
        boundaries=(
            data.boundaries
            if data.boundaries is not None
            else planning.boundaries_of(plan, profile)
        ),
        num_microbatches=data.num_microbatches or plan.num_microbatches,
        schedule=data.schedule or plan.schedule,
        virtual_stages=plan.virtual_stages
        if (data.schedule or plan.schedule) == "interleaved-1f1b"
        else 1,
        microbatch_size=data.microbatch_size or plan.microbatch_size,
        optimizer=plan.optimizer,
        policies=data.policies if data.policies is not None else plan.policies,
    )
    if data.boundaries is None and any(stage.replicas > 1 for stage in plan.stages):
        document = plan.model_dump(mode="json") | {
            "policies": manual.policies,
            "num_microbatches": manual.num_microbatches,
            "schedule": manual.schedule,
            "microbatch_size": manual.microbatch_size,
        }
        return planning.checked_plan(profile, document, "plan")
    return planning.manual_plan(
        profile, manual, field="", provenance={**plan.provenance, "edited_by": data.author}
    )


def update_plan(
    session: Session, plan_id: int, data: PlanUpdate, max_ops: int | None
) -> models.Plan:
    row = Plans(session).get(plan_id, for_update=True)
    if row.state == "launched":
        raise ConflictError(
            f"plan {plan_id} was launched and cannot change; copy it to a new plan instead"
        )
    profile, cluster = documents(session, row.profile_id, row.cluster_id)
    edited = _edited(Plan.model_validate(row.document), profile, data)
    if edited is not None:
        if row.state != "draft" and data.state != "draft":
            raise ConflictError(f"plan {plan_id} is {row.state}; set state 'draft' to edit it")
        row.state = "draft"
        row.approved_at = None
        _store(session, row, edited, profile, cluster, max_ops)
    if data.name is not None:
        row.name = data.name
    if data.state is not None and data.state != row.state:
        if data.state == "approved" and not data.force:
            problems = approval_problems(session, row, cluster)
            if problems:
                raise InputError(
                    "force",
                    f"plan {plan_id} {'; '.join(problems)}: approve with force to run it anyway",
                )
        row.state = data.state
        row.approved_at = models.utcnow() if data.state == "approved" else None
    row.updated_at = models.utcnow()
    session.flush()
    return row


def approval_problems(session: Session, row: models.Plan, cluster: Cluster | None) -> list[str]:
    """Why plan ``row`` would not run as planned (module docstring); empty when it would."""
    plan = Plan.model_validate(row.document)
    problems = []
    summary = row.summary or {}
    limits = summary.get("stage_device_memory_bytes") or []
    peaks = summary.get("stage_peak_bytes") or []
    over = [
        f"stage {idx} by {_mib(peak - limit)}"
        for idx, (peak, limit) in enumerate(zip(peaks, limits, strict=False))
        if limit is not None and peak > limit
    ]
    if over or summary.get("fits") is False:
        problems.append(
            "does not fit its cluster's memory" + (f" (over: {', '.join(over)})" if over else "")
        )
    ranks = plan.num_workers
    if cluster is not None and ranks > cluster.num_devices:
        problems.append(f"needs {ranks} ranks but its cluster has {cluster.num_devices} devices")
    slots = sum(worker.slots for worker in Workers(session).online())
    if ranks > slots:
        problems.append(f"needs {ranks} ranks but the online workers offer {slots} slots")
    return problems


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.2f} MiB"


def delete_plan(session: Session, plan_id: int) -> None:
    row = Plans(session).get(plan_id, for_update=True)
    if Runs(session).runs_of_plan(plan_id):
        raise ConflictError(f"plan {plan_id} has runs and is kept as their record")
    Plans(session).delete(row)


def simulate_plan(
    session: Session, plan_id: int, steps: int, with_timeline: bool, max_ops: int | None
) -> SimResult:
    row = Plans(session).get(plan_id)
    profile, cluster = documents(session, row.profile_id, row.cluster_id)
    return planning.run_simulation(
        profile,
        Plan.model_validate(row.document),
        cluster,
        steps=steps,
        with_timeline=with_timeline,
        max_ops=max_ops,
        where="",
    )


def preview(session: Session, data: AnyPreviewRequest, max_ops: int | None) -> SimResult:
    """Simulate the plan ``data`` describes, storing nothing."""
    profile, cluster = documents(session, data.profile_id, data.cluster_id)
    plan, _, _ = planning.plan_from_source(profile, cluster, data, "preview", max_ops)
    return planning.run_simulation(
        profile,
        plan,
        cluster,
        steps=data.steps,
        with_timeline=data.with_timeline,
        max_ops=max_ops,
        where=data.source_kind,
    )


def compare(session: Session, data: CompareRequest, max_ops: int | None) -> list[CompareRow]:
    """Every planner (or those named) on one request; optionally stored as drafts. The
    request's work budget is shared: each planner gets its part of ``max_ops``."""
    names = data.algorithms or list(PLANNERS)
    for idx, name in enumerate(names):
        planning.check_algorithm(name, f"algorithms.{idx}")
    profile, cluster = documents(session, data.profile_id, data.cluster_id)
    request = planning.planner_request(profile, cluster, data)
    share = None if max_ops is None else max(1, max_ops // len(names))
    # saved plans are simulated again, for 2 steps (``_store``): within the share too
    planning.within_budget(
        lambda: check_request_budget(request, share, num_steps=2 if data.save else 1), ""
    )
    rows = []
    for name in names:
        outcome = run_planner(
            name,
            PLANNERS[name],
            request,
            with_timeline=False,
            max_ops=share,
            auto=data.schedule == AUTO,
        )
        plan_id = None
        if data.save and outcome.plan is not None:
            plan_id = create_plan(
                session,
                PlanFromDocument(
                    profile_id=data.profile_id,
                    cluster_id=data.cluster_id,
                    author=data.author,
                    plan=outcome.plan,
                ),
                share,
            ).id
        summary = None if outcome.result is None else planning.summarize(outcome.result)
        rows.append(
            CompareRow(
                algorithm=name,
                plan_id=plan_id,
                summary=summary,
                plan=None if outcome.plan is None else outcome.plan.model_dump(mode="json"),
                planner_ms=outcome.planner_ms,
                objective_ms=outcome.objective_ms,
                error=outcome.error,
                min_memory_bytes=outcome.min_memory_bytes,
            )
        )
    return rows


def plan_for_launch(session: Session, plan_id: int) -> tuple[models.Plan, Plan]:
    row = Plans(session).get(plan_id, for_update=True)
    if row.state == "draft":
        raise ConflictError(f"plan {plan_id} is a draft; approve it before launching")
    return row, Plan.model_validate(row.document)
