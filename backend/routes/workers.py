"""/api/workers and /api/health."""

from typing import Annotated

from fastapi import APIRouter, Path, Query

from pipestudio import __version__
from pipestudio.backend.deps import ContextDep, Readable, SessionDep
from pipestudio.backend.repositories import Workers, retained
from pipestudio.backend.schemas.common import ERRORS
from pipestudio.backend.schemas.workers import HealthPublic, WorkerPublic, WorkersPublic

router = APIRouter(prefix="/api/workers", tags=["workers"], responses=ERRORS)
health = APIRouter(prefix="/api/health", tags=["health"])


@router.get("", dependencies=[Readable])
def list_workers(
    session: SessionDep,
    context: ContextDep,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    include_retired: bool = False,
) -> WorkersPublic:
    """Registered workers, their devices, the models they allow, free slots and last
    heartbeat. Offline workers last heard from before the retention period
    (``PIPESTUDIO_WORKER_RETENTION_S``) are left out unless ``include_retired``."""
    where = [] if include_retired else [retained(context.settings.worker_retention_s)]
    rows, total = Workers(session).page(offset, limit, *where)
    return WorkersPublic(data=[WorkerPublic.model_validate(r) for r in rows], count=total)


@router.get("/{worker_id}", dependencies=[Readable])
def get_worker(session: SessionDep, worker_id: Annotated[str, Path(max_length=64)]) -> WorkerPublic:
    return WorkerPublic.model_validate(Workers(session).get(worker_id))


@health.get("")
async def get_health(context: ContextDep) -> HealthPublic:
    return HealthPublic(
        status="ok",
        version=__version__,
        database=context.db.dialect,
        workers_online=len(context.hub.links),
    )
