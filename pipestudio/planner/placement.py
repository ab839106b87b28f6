"""Ranks that share a host's cores, as the simulator should see them.

A plan gives every stage replica a device of its own. On CPU hosts the workers' ranks get
the host's cores / the ranks there threads each (at least one), so a host that runs more
ranks than it has cores runs them time-sharing: ``cores // threads`` of them compute at
once. The simulator models that as it models stages that share a device: each of the
host's compute slots is a device, the host's ranks are placed on its slots round-robin,
and two ranks on one slot compute one op at a time (docs/simulator.md). Hosts with a core
per rank change nothing.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from pipestudio.planner.cluster import Cluster, cluster_template
from pipestudio.planner.plan import Plan


@dataclass(frozen=True)
class Host:
    """A host, its cores and the threads each of the run's ranks there uses."""

    name: str
    cores: int
    threads: int

    @property
    def slots(self) -> int:
        return max(1, self.cores // max(1, self.threads))


def shared_placement(plan: Plan, cluster: Cluster | None, hosts: Sequence[Host],
                     host_of: Sequence[Sequence[int]]) -> tuple[Plan, Cluster] | None:
    """The plan and cluster of ranks placed on their hosts' compute slots, when some host
    runs more of ``plan``'s ranks than it has slots (else None: nothing is shared).
    ``host_of[s][r]`` indexes ``hosts`` for replica r of stage s. Links keep the
    bandwidth of ``cluster``'s innermost level (free without a cluster)."""
    counts = [0] * len(hosts)
    for stage in host_of:
        for host in stage:
            counts[host] += 1
    if all(count <= hosts[h].slots for h, count in enumerate(counts)):
        return None
    first_slot, total = [], 0
    for each in hosts:
        first_slot.append(total)
        total += each.slots
    taken = [0] * len(hosts)
    devices = []
    for stage in host_of:
        placed = []
        for host in stage:
            placed.append(first_slot[host] + taken[host] % hosts[host].slots)
            taken[host] += 1
        devices.append(placed)
    stages = [stage.model_copy(update={"devices": placed})
              for stage, placed in zip(plan.stages, devices, strict=True)]
    bandwidth = None if cluster is None else cluster.levels[0].bandwidth_gbps
    shared = cluster_template([total], [bandwidth], name=f"{total} compute slots, shared")
    return plan.model_copy(update={"stages": stages}), shared
