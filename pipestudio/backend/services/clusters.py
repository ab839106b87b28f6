"""Clusters: validated Cluster documents; deletion refused while a plan uses one."""

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.repositories import Clusters, Plans
from pipestudio.backend.schemas.clusters import ClusterCreate


def create_cluster(session: Session, data: ClusterCreate) -> models.Cluster:
    cluster = data.cluster
    name = data.name or cluster.name or f"{cluster.num_devices} devices"
    return Clusters(session).add(models.Cluster(
        name=name, num_devices=cluster.num_devices,
        document=cluster.model_dump(mode="json")))


def delete_cluster(session: Session, cluster_id: int) -> None:
    row = Clusters(session).get(cluster_id, for_update=True)
    Plans(session).refuse_if_used(models.Plan.cluster_id, cluster_id, f"cluster {cluster_id}")
    Clusters(session).delete(row)
