"""/api/workers and /api/health."""

from typing import Annotated

from fastapi import APIRouter, Query

from pipestudio import __version__
from pipestudio.backend.deps import ContextDep, SessionDep
from pipestudio.backend.repositories import Workers
from pipestudio.backend.schemas.common import ERRORS
from pipestudio.backend.schemas.workers import HealthPublic, WorkerPublic, WorkersPublic

router = APIRouter(prefix="/api/workers", tags=["workers"], responses=ERRORS)
health = APIRouter(prefix="/api/health", tags=["health"])


@router.get("")
def list_workers(session: SessionDep, offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> WorkersPublic:
    """Registered workers, their devices, free slots and last heartbeat."""
    rows, total = Workers(session).page(offset, limit)
    return WorkersPublic(data=[WorkerPublic.model_validate(r) for r in rows], count=total)


@router.get("/{worker_id}")
def get_worker(session: SessionDep, worker_id: str) -> WorkerPublic:
    return WorkerPublic.model_validate(Workers(session).get(worker_id))


@health.get("")
async def get_health(context: ContextDep) -> HealthPublic:
    return HealthPublic(status="ok", version=__version__, database=context.db.dialect,
                        workers_online=len(context.hub.links))
