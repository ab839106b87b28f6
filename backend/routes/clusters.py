"""/api/clusters: hardware descriptions."""

from typing import Annotated

from fastapi import APIRouter, Query

from pipestudio.backend.deps import Authorized, ContextDep, Readable, SessionDep
from pipestudio.backend.repositories import Clusters
from pipestudio.backend.schemas.clusters import (
    ClusterCreate,
    ClusterFromWorkers,
    ClusterFromWorkersPublic,
    ClusterPublic,
    ClustersPublic,
)
from pipestudio.backend.schemas.common import ERRORS, PathId
from pipestudio.backend.services import clusters as service
from pipestudio.backend.services.links import measure_from_thread

router = APIRouter(prefix="/api/clusters", tags=["clusters"], responses=ERRORS)


@router.post("", status_code=201, dependencies=[Authorized])
def create_cluster(session: SessionDep, data: ClusterCreate) -> ClusterPublic:
    return ClusterPublic.model_validate(service.create_cluster(session, data))


@router.post("/from-workers", status_code=201, dependencies=[Authorized])
def cluster_from_workers(
    session: SessionDep, context: ContextDep, data: ClusterFromWorkers
) -> ClusterFromWorkersPublic:
    """A cluster of the online workers (or ``worker_ids``): a device per slot, grouped by
    host, with the links' bandwidths given or measured by the workers
    (``measure_links``); 409 when a worker is not online, the hosts hold different numbers
    of slots, or a link cannot be measured (the reason names both ends)."""
    hosts = service.hosts_of_workers(session, data.worker_ids)
    links = []
    if data.measure_links and len(hosts) > 1:
        endpoints = service.endpoints(hosts, context.hub)
        links = measure_from_thread(context.hub, endpoints, data.measure_seconds)
    row = service.cluster_from_workers(session, data, hosts, links)
    return ClusterFromWorkersPublic.model_validate(
        {**ClusterPublic.model_validate(row).model_dump(), "links": links}
    )


@router.get("", dependencies=[Readable])
def list_clusters(
    session: SessionDep,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ClustersPublic:
    rows, total = Clusters(session).page(offset, limit)
    return ClustersPublic(data=[ClusterPublic.model_validate(r) for r in rows], count=total)


@router.get("/{cluster_id:int}", dependencies=[Readable])
def get_cluster(session: SessionDep, cluster_id: PathId) -> ClusterPublic:
    return ClusterPublic.model_validate(Clusters(session).get(cluster_id))


@router.put("/{cluster_id:int}", dependencies=[Authorized])
def replace_cluster(session: SessionDep, cluster_id: PathId, data: ClusterCreate) -> ClusterPublic:
    """Replace a cluster's name and document; 409 while a plan uses it."""
    return ClusterPublic.model_validate(service.replace_cluster(session, cluster_id, data))


@router.delete("/{cluster_id:int}", status_code=204, dependencies=[Authorized])
def delete_cluster(session: SessionDep, cluster_id: PathId) -> None:
    """Delete a cluster; 409 while a plan uses it."""
    service.delete_cluster(session, cluster_id)
