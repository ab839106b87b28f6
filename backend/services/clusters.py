"""Clusters: validated Cluster documents; changes and deletion refused while a plan uses one
(its predictions were made on the cluster as it was)."""

from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from pipestudio.backend import models
from pipestudio.backend.errors import ConflictError
from pipestudio.backend.hub import Hub
from pipestudio.backend.repositories import Clusters, Plans, Workers
from pipestudio.backend.schemas.clusters import ClusterCreate, ClusterFromWorkers
from pipestudio.backend.services.links import Endpoint
from pipestudio.planner import Cluster
from pipestudio.planner.formats.cluster import Device, Level


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


def hosts_of_workers(
    session: Session, worker_ids: list[str] | None
) -> dict[str, list[models.Worker]]:
    """The chosen online workers with a slot (every online one when ``worker_ids`` is
    None), grouped by host (their advertised address); 409 when a worker is not online or
    none has a slot."""
    online = Workers(session).online()
    chosen = online
    if worker_ids is not None:
        by_id = {worker.id: worker for worker in online}
        unknown = sorted(set(worker_ids) - set(by_id))
        if unknown:
            raise ConflictError(f"worker_ids: worker(s) {', '.join(unknown)} are not online")
        chosen = [by_id[worker_id] for worker_id in dict.fromkeys(worker_ids)]
    hosts: dict[str, list[models.Worker]] = {}
    for worker in chosen:
        if worker.slots > 0:
            hosts.setdefault(worker.host, []).append(worker)
    if not hosts:
        raise ConflictError("no online worker with a slot to make a cluster of")
    return hosts


def endpoints(hosts: dict[str, list[models.Worker]], hub: Hub) -> list[Endpoint]:
    """A worker per host to measure its links (``links.py``): the first that is connected
    and serves a link probe, else the first (whose measurement then fails naming it)."""
    chosen = []
    for host, workers in hosts.items():
        ready = [w for w in workers if getattr(hub.links.get(w.id), "probe_port", None)]
        worker = (ready or workers)[0]
        chosen.append(Endpoint(worker.id, worker.name, host))
    return chosen


def cluster_from_workers(
    session: Session,
    data: ClusterFromWorkers,
    hosts: dict[str, list[models.Worker]],
    links: list[dict[str, Any]] | None = None,
) -> models.Cluster:
    """``hosts`` (``hosts_of_workers``) as a cluster: the hosts are the outer level, each
    slot of a worker a device of its host (its GPU's memory, or the host's memory shared by
    its slots), linked at the bandwidths given or, with ``links`` measured and no
    bandwidth between hosts given, at the slowest of them; 409 when the hosts hold
    different numbers of slots (the levels of a cluster are uniform)."""
    slots = {host: sum(w.slots for w in workers) for host, workers in hosts.items()}
    if len(set(slots.values())) > 1:
        listed = ", ".join(f"{host} {count}" for host, count in slots.items())
        raise ConflictError(
            f"the hosts hold different numbers of slots ({listed}): a cluster's levels are "
            "uniform; choose workers with worker_ids so that every host holds as many"
        )
    devices = [
        Device(name=f"{worker.name[:180]}/{slot}", memory_bytes=_memory(worker, slot))
        for workers in hosts.values()
        for worker in workers
        for slot in range(worker.slots)
    ]
    names = [device.name for device in devices]
    if len(set(names)) != len(names):  # two workers of one name: tell them apart by id
        devices = [
            device.model_copy(update={"name": f"{idx}:{device.name}"})
            for idx, device in enumerate(devices)
        ]
    levels = [
        Level(name="host", size=next(iter(slots.values())), bandwidth_gbps=data.within_host_gbps)
    ]
    between = data.between_hosts_gbps
    if links and between is None:
        between = min(link["gbps"] for link in links)
    if len(hosts) > 1:
        levels.append(Level(name="network", size=len(hosts), bandwidth_gbps=between))
    name = data.name or f"{len(hosts)} host{'s' if len(hosts) > 1 else ''}"
    if links and not data.name and data.between_hosts_gbps is None:
        name += f", links measured ({between:.3g} Gbit/s slowest)"
    try:
        cluster = Cluster(name=name, levels=levels, devices=devices)
    except ValidationError as exc:  # beyond a document's limits (devices, level sizes)
        error = exc.errors()[0]
        raise ConflictError(f"the workers make no valid cluster: {error['msg']}") from None
    return create_cluster(session, ClusterCreate(name=name, cluster=cluster))


def _memory(worker: models.Worker, slot: int) -> int | None:
    """A slot's device memory: its GPU's (slots take the GPUs in turn), else the host's
    memory over the worker's slots; None where the worker did not say."""
    devices = [d for d in (worker.devices or []) if isinstance(d, dict)]
    if not devices:
        return None
    device = devices[slot % len(devices)]
    memory = device.get("memory_bytes")
    if not isinstance(memory, int) or isinstance(memory, bool) or memory < 1:
        return None
    if device.get("kind") == "cuda":
        return memory
    return max(memory // worker.slots, 1)
