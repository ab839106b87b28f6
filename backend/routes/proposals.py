"""/api/proposals: the online planner's repartitions; approve (migrate) or reject."""

from typing import Annotated

from fastapi import APIRouter, Query

from pipestudio.backend.deps import ContextDep, Readable, SessionDep, Writer, author
from pipestudio.backend.models import Proposal as ProposalRow
from pipestudio.backend.repositories import Proposals
from pipestudio.backend.schemas.common import ERRORS, PathId, QueryId
from pipestudio.backend.schemas.proposals import (
    ProposalCreate,
    ProposalDecision,
    ProposalPublic,
    ProposalsPublic,
    ProposalState,
)
from pipestudio.backend.services import proposals as service

router = APIRouter(prefix="/api/proposals", tags=["proposals"], responses=ERRORS)


@router.post("", status_code=201)
def create_proposal(
    session: SessionDep, context: ContextDep, principal: Writer, data: ProposalCreate
) -> ProposalPublic:
    """Weigh a repartition of a run for an observed profile (and cluster), or store a Proposal."""
    data = data.model_copy(update={"author": author(principal, data.author)})
    row = ProposalPublic.model_validate(service.create_proposal(session, data))
    context.hub.publish_from_thread(
        row.run_id,
        {"type": "proposal", "run_id": row.run_id, "proposal_id": row.id, "state": row.state},
    )
    return row


@router.get("", dependencies=[Readable])
def list_proposals(
    session: SessionDep,
    run_id: QueryId | None = None,
    state: ProposalState | None = None,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ProposalsPublic:
    where = []
    if run_id is not None:
        where.append(ProposalRow.run_id == run_id)
    if state is not None:
        where.append(ProposalRow.state == state)
    rows, total = Proposals(session).page(offset, limit, *where)
    return ProposalsPublic(data=[ProposalPublic.model_validate(r) for r in rows], count=total)


@router.get("/{proposal_id:int}", dependencies=[Readable])
def get_proposal(session: SessionDep, proposal_id: PathId) -> ProposalPublic:
    return ProposalPublic.model_validate(Proposals(session).get(proposal_id))


@router.post("/{proposal_id:int}/approve")
def approve_proposal(
    session: SessionDep,
    context: ContextDep,
    principal: Writer,
    proposal_id: PathId,
    data: ProposalDecision | None = None,
) -> ProposalPublic:
    """Approve: rank 0's worker gets the migration; its outcome is recorded."""
    row = service.approve(
        session,
        proposal_id,
        author(principal, data.author if data else "api"),
        context.hub.send_from_thread,
    )
    return ProposalPublic.model_validate(row)


@router.post("/{proposal_id:int}/reject")
def reject_proposal(
    session: SessionDep,
    principal: Writer,
    proposal_id: PathId,
    data: ProposalDecision | None = None,
) -> ProposalPublic:
    return ProposalPublic.model_validate(
        service.reject(session, proposal_id, author(principal, data.author if data else "api"))
    )
