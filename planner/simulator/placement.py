"""Ranks that share a host's cores or a GPU, as the simulator should see them.

A plan gives every stage replica a device of its own. On CPU hosts the workers' ranks get
the host's cores / the ranks there threads each (at least one), so a host that runs more
ranks than it has cores runs them time-sharing: ``cores // threads`` of them compute at
once. On GPUs the engine puts a rank on ``plan device % local GPUs``, so a host with fewer
GPUs than ranks puts several on one GPU, which runs their kernels one after another. The
simulator models both as it models stages that share a device: each of the host's compute
slots (a GPU is one slot) is a device, the ranks are placed on their host's slots
round-robin, two ranks on one slot compute one op at a time, and on a GPU their transfers
go through host memory (docs/simulator.md). Hosts with a slot per rank change nothing.

``started_hosts`` reads where each rank ran from the ``start`` events a run writes (host,
device, cores and threads), so a run's metrics alone say how it was placed.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipestudio.planner.formats.cluster import Cluster, Device, Level
from pipestudio.planner.formats.plan import Plan


@dataclass(frozen=True)
class Host:
    """A host, its cores and the threads each of the run's ranks there uses; or, with
    ``gpu``, one GPU of a host (one compute slot, however many ranks it holds)."""

    name: str
    cores: int
    threads: int
    gpu: bool = False

    @property
    def slots(self) -> int:
        return max(1, self.cores // max(1, self.threads))


def crowded_hosts(hosts: Sequence[Host], host_of: Sequence[Sequence[int]]) -> set[int]:
    """The hosts (indices into ``hosts``) that run more ranks than they have slots."""
    counts = [0] * len(hosts)
    for stage in host_of:
        for host in stage:
            counts[host] += 1
    return {h for h, count in enumerate(counts) if count > hosts[h].slots}


def shared_placement(
    plan: Plan, cluster: Cluster | None, hosts: Sequence[Host], host_of: Sequence[Sequence[int]]
) -> tuple[Plan, Cluster] | None:
    """The plan and cluster of ranks placed on their hosts' compute slots, when some host
    runs more of ``plan``'s ranks than it has slots (else None: nothing is shared).
    ``host_of[s][r]`` indexes ``hosts`` for replica r of stage s. Links keep the
    bandwidth of ``cluster``'s innermost level (free without a cluster); a GPU keeps the
    memory and host links of ``cluster``'s device that the first rank placed on it was
    given (a CPU slot has neither: its ranks share the host's memory)."""
    if not crowded_hosts(hosts, host_of):
        return None
    first_slot, total = [], 0
    for each in hosts:
        first_slot.append(total)
        total += each.slots
    taken = [0] * len(hosts)
    slot_devices: dict[int, Device] = {}
    devices = []
    for stage, given in zip(host_of, plan.worker_devices(), strict=True):
        placed = []
        for host, device in zip(stage, given, strict=True):
            slot = first_slot[host] + taken[host] % hosts[host].slots
            placed.append(slot)
            taken[host] += 1
            if hosts[host].gpu and cluster is not None and slot not in slot_devices:
                slot_devices[slot] = cluster.devices[device % cluster.num_devices]
        devices.append(placed)
    stages = [
        stage.model_copy(update={"devices": placed})
        for stage, placed in zip(plan.stages, devices, strict=True)
    ]
    bandwidth = None if cluster is None else cluster.levels[0].bandwidth_gbps
    shared = Cluster(
        name=f"{total} compute slots, shared",
        levels=[Level(name="level0", size=total, bandwidth_gbps=bandwidth)],
        devices=[
            slot_devices[slot].model_copy(update={"name": f"device{slot}"})
            if slot in slot_devices
            else Device(name=f"device{slot}")
            for slot in range(total)
        ],
    )
    return plan.model_copy(update={"stages": stages}), shared


def started_hosts(
    plan: Plan, events: Iterable[Mapping[str, Any]]
) -> tuple[list[Host], list[list[int]]] | None:
    """The hosts (and GPUs) of a run and which one ran each stage replica of ``plan``
    (``shared_placement``'s ``hosts`` and ``host_of``), from the ``start`` events of its
    latest attempt; None when some stage replica has none, or one without the host's
    cores (a CPU rank) or its device."""
    starts: dict[tuple[int, int], Mapping[str, Any]] = {}
    latest = -1
    for event in events:
        if event.get("type") != "start":
            continue
        attempt = _count(event.get("attempt", 0))
        where = _count(event.get("stage")), _count(event.get("replica"))
        if attempt is None or where[0] is None or where[1] is None:
            continue
        if attempt > latest:
            starts, latest = {}, attempt
        if attempt == latest:
            starts[(where[0], where[1])] = event
    hosts: list[Host] = []
    index: dict[str, int] = {}
    host_of: list[list[int]] = []
    for stage_idx, stage in enumerate(plan.stages):
        row = []
        for replica in range(stage.replicas):
            found = starts.get((stage_idx, replica))
            host = _place(found) if found is not None else None
            if host is None:
                return None
            if host.name not in index:
                index[host.name] = len(hosts)
                hosts.append(host)
            row.append(index[host.name])
        host_of.append(row)
    return hosts, host_of


def _place(event: Mapping[str, Any]) -> Host | None:
    host, device = event.get("host"), event.get("device")
    if not isinstance(host, str) or not isinstance(device, str):
        return None
    if device.startswith("cuda"):
        return Host(f"{host} {device}", 1, 1, gpu=True)
    cores, threads = _count(event.get("cores")), _count(event.get("threads"))
    if device != "cpu" or not cores or not threads:
        return None
    return Host(host, cores, threads)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
