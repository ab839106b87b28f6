"""/api/workers and /api/health."""

from typing import Annotated

from fastapi import APIRouter, Path, Query

from pipestudio import __version__
from pipestudio.backend.deps import Authorized, ContextDep, Readable, SessionDep
from pipestudio.backend.repositories import Workers, retained
from pipestudio.backend.schemas.clusters import LinksMeasure, LinksPublic
from pipestudio.backend.schemas.common import ERRORS
from pipestudio.backend.schemas.workers import HealthPublic, WorkerPublic, WorkersPublic
from pipestudio.backend.services.clusters import endpoints, hosts_of_workers
from pipestudio.backend.services.links import measure_from_thread

router = APIRouter(prefix="/api/workers", tags=["workers"], responses=ERRORS)
health = APIRouter(prefix="/api/health", tags=["health"])
#: Apart from /api/workers, whose /{worker_id} would also match a path under it.
links = APIRouter(prefix="/api/links", tags=["workers"], responses=ERRORS)


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


@links.post("", dependencies=[Authorized])
def measure_links(session: SessionDep, context: ContextDep, data: LinksMeasure) -> LinksPublic:
    """The workers measure the link of every pair of their hosts (one worker stands for
    each host), in rounds that use each host once, about ``seconds`` a pair; 409 naming
    both ends and the reason when a link cannot be measured."""
    hosts = hosts_of_workers(session, data.worker_ids)
    links = measure_from_thread(context.hub, endpoints(hosts, context.hub), data.seconds)
    return LinksPublic.model_validate({"data": links})


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
