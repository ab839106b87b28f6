"""Clusters: validated Cluster documents; changes and deletion refused while a plan uses one
(its predictions were made on the cluster as it was)."""

from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.repositories import Clusters, Plans
from pipestudio.backend.schemas.clusters import ClusterCreate


def _name(data: ClusterCreate) -> str:
    return data.name or data.cluster.name or f"{data.cluster.num_devices} devices"


def create_cluster(session: Session, data: ClusterCreate) -> models.Cluster:
    cluster = data.cluster
    return Clusters(session).add(
        models.Cluster(
            name=_name(data),
            num_devices=cluster.num_devices,
            document=cluster.model_dump(mode="json"),
        )
    )


def replace_cluster(session: Session, cluster_id: int, data: ClusterCreate) -> models.Cluster:
    """Replace a cluster's name and document; 409 naming the plans that use it."""
    row = Clusters(session).get(cluster_id, for_update=True)
    Plans(session).refuse_if_used(
        models.Plan.cluster_id,
        cluster_id,
        f"cluster {cluster_id}",
        "their predictions were made on it as it is: save the change as a new cluster",
    )
    row.name, row.num_devices = _name(data), data.cluster.num_devices
    row.document = data.cluster.model_dump(mode="json")
    session.flush()
    return row


def delete_cluster(session: Session, cluster_id: int) -> None:
    row = Clusters(session).get(cluster_id, for_update=True)
    Plans(session).refuse_if_used(models.Plan.cluster_id, cluster_id, f"cluster {cluster_id}")
    Clusters(session).delete(row)
