"""A run's calibrated profile: its plan's profile made to match what the run measured.

The measurements are the run's stored ``op`` metrics of its latest attempt
(``planner/simulator/calibrate.py`` turns them into per-stage factors and link bandwidths). A run
that migrated layers runs another partition from the migration's step on, so only the
steps since the last migration the engine reported are used, with the partition the
migrations made; the first step of the run, which warms caches up, is left out, and so is
the step a migration happened in, and a live run's newest step, whose ops may still be on
their way. At most ``window`` steps, the latest.
"""

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import ConflictError
from pipestudio.backend.repositories import Clusters, Plans, Profiles, Runs
from pipestudio.backend.services.messages import TERMINAL_RUN_STATES
from pipestudio.planner import Cluster, Plan, Profile
from pipestudio.planner.simulator.calibrate import (
    CalibrationError,
    Sharing,
    calibrate,
    op_events,
    report,
)
from pipestudio.planner.simulator.placement import Host

#: Op events read at most for one calibration (a run's window of steps, all its ops).
MAX_OPS = 100_000


def calibrated(
    session: Session, run_id: int, window: int, max_ops: int | None = None
) -> dict[str, Any]:
    """The calibrated profile and cluster of run ``run_id`` and what they predict
    (``planner.calibrate.report``), over its latest ``window`` steps; ``max_ops`` bounds
    each simulation."""
    run = Runs(session).get(run_id)
    plan_row = Plans(session).get(run.plan_id)
    plan, profile, since = _plan_now(session, run)
    cluster = (
        Cluster.model_validate(Clusters(session).get(plan_row.cluster_id).document)
        if plan_row.cluster_id is not None
        else None
    )
    last = session.scalar(
        select(models.Metric.step)
        .where(models.Metric.run_id == run_id, models.Metric.kind == "op")
        .order_by(models.Metric.step.desc())
        .limit(1)
    )
    if last is None:
        raise ConflictError(f"run {run_id} has measured no op yet: wait for its first steps")
    if run.state not in TERMINAL_RUN_STATES:
        last -= 1  # the newest step of a live run may still be on its way
    first = max(since, 1, last - window + 1)
    if first > last:
        raise ConflictError(
            f"run {run_id} has measured no step since step {since}, when its "
            "layers last moved: wait for the next steps"
        )
    rows = session.scalars(
        select(models.Metric.data)
        .where(
            models.Metric.run_id == run_id,
            models.Metric.kind == "op",
            models.Metric.step >= first,
            models.Metric.step <= last,
        )
        .limit(MAX_OPS + 1)
    ).all()
    if len(rows) > MAX_OPS:
        raise ConflictError(
            f"steps {first}..{last} of run {run_id} hold more than {MAX_OPS} "
            "ops: ask for fewer steps (window)"
        )
    events = op_events(rows)
    try:
        calibration = calibrate(
            profile,
            plan,
            events,
            cluster,
            range(first, last + 1),
            max_ops,
            _sharing(session, run, plan),
        )
    except CalibrationError as exc:
        raise ConflictError(f"run {run_id}: {exc}") from None
    return {
        "run_id": run_id,
        "plan": plan.model_dump(mode="json"),
        "profile": calibration.profile.model_dump(mode="json"),
        "cluster": None
        if calibration.cluster is None
        else calibration.cluster.model_dump(mode="json"),
        **report(calibration, profile, plan, cluster, events, max_ops),
    }


def _sharing(session: Session, run: models.Run, plan: Plan) -> Sharing | None:
    """Where the run's ranks ran: as their ``start`` events of the run's latest attempt
    say (host, device, cores, threads), else, for runs whose events do not say, when
    every rank ran on a CPU worker that said how many cores it has (None otherwise);
    ``calibrate`` and ``report`` find whether any host ran more of them than it has cores
    for their threads, or put several on one GPU."""
    starts = session.scalars(
        select(models.Event.data).where(models.Event.run_id == run.id, models.Event.kind == "start")
    ).all()
    found = Sharing.of_run(plan, [data for data in starts if isinstance(data, dict)])
    if found is not None:
        return found
    ranks = Runs(session).ranks(run.id)
    workers = {
        w.id: w
        for w in session.scalars(
            select(models.Worker).where(models.Worker.id.in_({r.worker_id for r in ranks}))
        )
    }
    names: dict[str, int] = {}
    hosts: list[Host] = []
    host_of: list[list[int]] = [[0] * stage.replicas for stage in plan.stages]
    per_host: dict[str, int] = {}
    for rank in ranks:
        worker = workers.get(rank.worker_id)
        if (
            worker is None
            or rank.stage >= plan.num_stages
            or rank.replica >= plan.stages[rank.stage].replicas
        ):
            return None
        per_host[worker.host] = per_host.get(worker.host, 0) + 1
    for rank in ranks:
        worker = workers[rank.worker_id]
        cores = _cpu_cores(worker.devices)
        if cores is None:
            return None
        if worker.host not in names:
            threads = run.settings.get("threads_per_rank") or max(1, cores // per_host[worker.host])
            names[worker.host] = len(hosts)
            hosts.append(Host(worker.host, cores, int(threads)))
        host_of[rank.stage][rank.replica] = names[worker.host]
    return Sharing(hosts, host_of)


def _cpu_cores(devices: object) -> int | None:
    if not isinstance(devices, list) or not devices:
        return None
    first = devices[0]
    if not isinstance(first, dict) or first.get("kind") != "cpu":
        return None
    cores = first.get("cores")
    return (
        cores
        if isinstance(cores, int) and not isinstance(cores, bool) and 1 <= cores <= 1 << 16
        else None
    )


def current_plan(session: Session, run: models.Run) -> Plan:
    """The plan run ``run`` trains now: its plan with the migrations it reported done."""
    return _plan_now(session, run)[0]


def _plan_now(session: Session, run: models.Run) -> tuple[Plan, Profile, int]:
    """The plan ``run`` trains now (``plan_in_effect``), its plan's profile, and the first
    step that ran it whole."""
    plan_row = Plans(session).get(run.plan_id)
    plan = Plan.model_validate(plan_row.document)
    profile = Profile.model_validate(Profiles(session).get(plan_row.profile_id).document)
    plan, since = plan_in_effect(plan, profile, _migrations(session, run.id))
    return plan, profile, since


def _migrations(session: Session, run_id: int) -> list[dict[str, Any]]:
    """The engine's reports of migrations that took effect, in order of their step."""
    rows = session.scalars(
        select(models.Event.data).where(
            models.Event.run_id == run_id, models.Event.kind == "migration"
        )
    ).all()
    done = [
        data
        for data in rows
        if isinstance(data, dict)
        and data.get("phase") == "done"
        and isinstance(data.get("step"), int)
        and isinstance(data.get("moves"), list)
    ]
    return sorted(done, key=lambda data: data["step"])


def plan_in_effect(
    plan: Plan, profile: Profile, migrations: list[dict[str, Any]]
) -> tuple[Plan, int]:
    """The plan after ``migrations`` (each moves layers between stages from its step on) and
    the first step that runs it whole (0 without migrations)."""
    if not migrations:
        return plan, 0
    stage_of = {name: idx for idx, stage in enumerate(plan.stages) for name in stage.layers}
    for migration in migrations:
        for move in migration["moves"]:
            if (
                isinstance(move, dict)
                and move.get("layer") in stage_of
                and isinstance(move.get("to_stage"), int)
                and 0 <= move["to_stage"] < plan.num_stages
            ):
                stage_of[move["layer"]] = move["to_stage"]
    stages = [
        stage.model_copy(
            update={
                "layers": [
                    layer.name for layer in profile.layers if stage_of.get(layer.name) == idx
                ]
            }
        )
        for idx, stage in enumerate(plan.stages)
    ]
    moved = plan.model_copy(update={"stages": stages})
    try:
        return Plan.model_validate(moved.model_dump(mode="json")), migrations[-1]["step"] + 1
    except ValueError as exc:
        raise ConflictError(f"the migrations the run reported give no valid plan: {exc}") from None
