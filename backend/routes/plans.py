"""/api/plans: create (planner, by hand, document), simulate, compare, edit, approve."""

from typing import Annotated, Any

from fastapi import APIRouter, Query

from pipestudio.backend.context import AppContext
from pipestudio.backend.deps import (
    Authorized,
    ContextDep,
    Readable,
    SessionDep,
    Writer,
    author,
)
from pipestudio.backend.models import Plan as PlanRow
from pipestudio.backend.repositories import Plans
from pipestudio.backend.schemas.common import ERRORS, PathId, QueryId
from pipestudio.backend.schemas.plans import (
    ComparePublic,
    CompareRequest,
    PlanCreate,
    PlanPublic,
    PlansPublic,
    PlanState,
    PlanUpdate,
    PreviewRequest,
    SimulateRequest,
)
from pipestudio.backend.services import plans as service

router = APIRouter(prefix="/api/plans", tags=["plans"], responses=ERRORS)


@router.post("", status_code=201)
def create_plan(
    session: SessionDep, context: ContextDep, principal: Writer, data: PlanCreate
) -> PlanPublic:
    """Make a plan with a planner, by hand (boundaries and policies), or from a document;
    it is simulated and stored as a draft."""
    data = data.model_copy(update={"author": author(principal, data.author)})
    return PlanPublic.model_validate(service.create_plan(session, data, _budget(context)))


@router.get("", dependencies=[Readable])
def list_plans(
    session: SessionDep,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    profile_id: QueryId | None = None,
    state: PlanState | None = None,
) -> PlansPublic:
    where = []
    if profile_id is not None:
        where.append(PlanRow.profile_id == profile_id)
    if state is not None:
        where.append(PlanRow.state == state)
    rows, total = Plans(session).page(offset, limit, *where)
    return PlansPublic(data=[PlanPublic.model_validate(r) for r in rows], count=total)


@router.post("/simulate", dependencies=[Readable])
def preview_plan(session: SessionDep, context: ContextDep, data: PreviewRequest) -> dict[str, Any]:
    """Simulate a plan without storing it; answers the SimResult document (422 beyond the
    work budget, naming the field and the limit)."""
    return service.preview(session, data, _budget(context)).model_dump(mode="json")


@router.post("/compare")
def compare_planners(
    session: SessionDep, context: ContextDep, principal: Writer, data: CompareRequest
) -> ComparePublic:
    """Run every planner (or those named) on one request; ``save`` stores their plans."""
    data = data.model_copy(update={"author": author(principal, data.author)})
    return ComparePublic(rows=service.compare(session, data, _budget(context)))


@router.get("/{plan_id:int}", dependencies=[Readable])
def get_plan(session: SessionDep, plan_id: PathId) -> PlanPublic:
    return PlanPublic.model_validate(Plans(session).get(plan_id))


@router.patch("/{plan_id:int}")
def update_plan(
    session: SessionDep, context: ContextDep, principal: Writer, plan_id: PathId, data: PlanUpdate
) -> PlanPublic:
    """Edit a draft (boundaries, policies, shape, document) or change its state
    (draft <-> approved); a launched plan is frozen (409)."""
    data = data.model_copy(update={"author": author(principal, data.author)})
    return PlanPublic.model_validate(service.update_plan(session, plan_id, data, _budget(context)))


@router.post("/{plan_id:int}/approve", dependencies=[Authorized])
def approve_plan(
    session: SessionDep,
    context: ContextDep,
    plan_id: PathId,
    force: Annotated[bool, Query()] = False,
) -> PlanPublic:
    """Approve a plan for launching; 422 naming why when it does not fit its cluster's
    memory or needs more ranks than its cluster or the online workers offer, unless
    ``force``."""
    return PlanPublic.model_validate(
        service.update_plan(
            session, plan_id, PlanUpdate(state="approved", force=force), _budget(context)
        )
    )


@router.post("/{plan_id:int}/simulate", dependencies=[Readable])
def simulate_plan(
    session: SessionDep, context: ContextDep, plan_id: PathId, data: SimulateRequest
) -> dict[str, Any]:
    """The SimResult document of a stored plan on its profile and cluster."""
    return service.simulate_plan(
        session, plan_id, data.steps, data.with_timeline, _budget(context)
    ).model_dump(mode="json")


def _budget(context: AppContext) -> int:
    return context.settings.max_simulated_ops


@router.delete("/{plan_id:int}", status_code=204, dependencies=[Authorized])
def delete_plan(session: SessionDep, plan_id: PathId) -> None:
    """Delete a plan; 409 when runs used it."""
    service.delete_plan(session, plan_id)
