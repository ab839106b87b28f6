"""/api/runs: launch an approved plan on workers, status, stop, metrics, events."""

from typing import Annotated

from fastapi import APIRouter, Query

from pipestudio.backend.deps import Authorized, ContextDep, Readable, SessionDep, Writer, author
from pipestudio.backend.protocol import METRIC_KINDS
from pipestudio.backend.repositories import Runs
from pipestudio.backend.schemas.common import ERRORS, PathId
from pipestudio.backend.schemas.runs import (
    CalibratedProfilePublic,
    EventPublic,
    EventsPublic,
    MetricKind,
    MetricPublic,
    MetricsPublic,
    RunCreate,
    RunPublic,
    RunsPublic,
)
from pipestudio.backend.services import calibration
from pipestudio.backend.services import runs as service

router = APIRouter(prefix="/api/runs", tags=["runs"], responses=ERRORS)


@router.post("", status_code=201)
def launch_run(
    session: SessionDep, context: ContextDep, principal: Writer, data: RunCreate
) -> RunPublic:
    """Launch an approved plan: ranks go to online workers with free slots that allow its
    model (409 when there are too few), and the workers start the engine. The model and
    its arguments default to the plan's profile's."""
    data = data.model_copy(update={"author": author(principal, data.author)})
    run = service.launch(
        session,
        data,
        set(context.hub.links),
        context.hub.send_from_thread,
        context.settings.checkpoint_dir,
    )
    return service.run_public(session, run)


@router.get("", dependencies=[Readable])
def list_runs(
    session: SessionDep,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> RunsPublic:
    rows, total = Runs(session).page(offset, limit)
    return RunsPublic(data=[service.run_public(session, r) for r in rows], count=total)


@router.get("/{run_id:int}", dependencies=[Readable])
def get_run(session: SessionDep, run_id: PathId) -> RunPublic:
    return service.run_public(session, Runs(session).get(run_id))


@router.post("/{run_id:int}/stop", dependencies=[Authorized])
def stop_run(session: SessionDep, context: ContextDep, run_id: PathId) -> RunPublic:
    run, actions = service.stop(session, run_id, context.hub.send_from_thread)
    for watched, message in actions.to_watchers:
        context.hub.publish_from_thread(watched, message)
    return service.run_public(session, run)


@router.get("/{run_id:int}/metrics", dependencies=[Readable])
def get_metrics(
    session: SessionDep,
    run_id: PathId,
    kind: Annotated[list[MetricKind] | None, Query()] = None,
    stage: Annotated[int | None, Query(ge=0, le=100_000)] = None,
    start_ms: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    end_ms: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    max_points: Annotated[int, Query(ge=1, le=100_000)] = 5000,
) -> MetricsPublic:
    """Metrics in time order on the run's clock (ms since it started), optionally of some
    kinds, one stage and a time range; thinned evenly to at most ``max_points``."""
    rows, total, stride = service.metrics(
        session, run_id, kind or list(METRIC_KINDS), stage, start_ms, end_ms, max_points
    )
    return MetricsPublic(
        data=[MetricPublic.model_validate(r) for r in rows],
        count=len(rows),
        total=total,
        stride=stride,
    )


@router.get("/{run_id:int}/events", dependencies=[Readable])
def get_events(
    session: SessionDep,
    run_id: PathId,
    kind: Annotated[list[str] | None, Query(max_length=50)] = None,
    after_id: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> EventsPublic:
    """Events (launch, start, checkpoint, summary, error, migration, failed...) after
    ``after_id``."""
    rows = service.events(session, run_id, kind, after_id, limit)
    return EventsPublic(data=[EventPublic.model_validate(r) for r in rows], count=len(rows))


@router.get("/{run_id:int}/calibrated-profile", dependencies=[Readable])
def get_calibrated_profile(
    session: SessionDep,
    context: ContextDep,
    run_id: PathId,
    window: Annotated[int, Query(ge=1, le=200)] = 20,
) -> CalibratedProfilePublic:
    """The run's profile calibrated from its latest ``window`` measured steps (since its
    last migration; not its first step), the cluster with calibrated links, and the step
    and each stage's compute measured, predicted from the profile and from the calibrated
    one. 409 while the run has measured nothing to calibrate from."""
    return CalibratedProfilePublic.model_validate(
        calibration.calibrated(session, run_id, window, context.settings.max_simulated_ops)
    )
