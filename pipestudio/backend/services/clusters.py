"""Clusters: validated Cluster documents; deletion refused while a plan uses one."""

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import InputError
from pipestudio.backend.repositories import Clusters, Plans
from pipestudio.backend.schemas.clusters import ClusterCreate
from pipestudio.planner import Cluster, PlannerError, parse_document


def create_cluster(session: Session, data: ClusterCreate) -> models.Cluster:
    try:
        cluster = parse_document(Cluster, data.cluster, source="cluster")
    except PlannerError as exc:
        raise InputError("cluster", str(exc)) from None
    name = data.name or cluster.name or f"{cluster.num_devices} devices"
    return Clusters(session).add(models.Cluster(
        name=name, num_devices=cluster.num_devices,
        document=cluster.model_dump(mode="json")))


def delete_cluster(session: Session, cluster_id: int) -> None:
    row = Clusters(session).get(cluster_id)
    Plans(session).refuse_if_used(models.Plan.cluster_id, cluster_id, f"cluster {cluster_id}")
    Clusters(session).delete(row)
