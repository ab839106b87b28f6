"""Clusters: hardware descriptions (the Cluster document)."""

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import Public, Request
from pipestudio.backend.schemas.runs import WorkerId
from pipestudio.planner import Cluster
from pipestudio.planner.formats.documents import Gbps


class ClusterCreate(Request):
    name: str | None = Field(None, max_length=200, description="Default: the document's name.")
    cluster: Cluster = Field(description="The Cluster document.")


#: About how long one pair's transfer takes, in seconds (at most 30).
MeasureSeconds = Annotated[
    float,
    Field(gt=0, le=30.0, allow_inf_nan=False, description="About how long each pair's "
          "transfer takes."),
]  # fmt: skip


class ClusterFromWorkers(Request):
    """A cluster of the workers as they are registered: one device per slot, grouped by
    host; the links' bandwidths are given (null: free), or the link between hosts is
    measured by the workers (``measure_links``)."""

    name: str | None = Field(None, max_length=200, description="Default: '<N> hosts'.")
    worker_ids: list[WorkerId] | None = Field(
        None, max_length=10_000, description="Default: every online worker."
    )
    within_host_gbps: Gbps | None = Field(
        None, description="Between two devices of one host; null: free."
    )
    between_hosts_gbps: Gbps | None = Field(None, description="Between two hosts; null: free.")
    measure_links: bool = Field(
        False,
        description="The workers measure the link of every pair of hosts (the answer's "
        "links); the slowest becomes the bandwidth between hosts (a cluster's levels are "
        "uniform) unless between_hosts_gbps is given, which then wins.",
    )
    measure_seconds: MeasureSeconds = 1.0


class LinksMeasure(Request):
    """Workers (one per host stands for it) measure the link of every pair of hosts."""

    worker_ids: list[WorkerId] | None = Field(
        None, max_length=10_000, description="Default: every online worker."
    )
    seconds: MeasureSeconds = 1.0


class LinkPublic(BaseModel):
    """One measured link, in the direction it was measured."""

    from_worker: str
    from_host: str
    to_worker: str
    to_host: str
    gbps: float = Field(description="What one TCP transfer achieved, Gbit/s.")
    latency_ms: float | None = Field(description="Half the median round trip of a byte.")
    bytes: int | None = Field(description="The size of the transfer measured.")
    seconds: float | None = Field(description="How long that transfer took.")


class LinksPublic(BaseModel):
    data: list[LinkPublic]


class ClusterPublic(Public):
    id: int
    name: str
    num_devices: int
    document: dict[str, Any]
    created_at: datetime


class ClusterFromWorkersPublic(ClusterPublic):
    links: list[LinkPublic] = Field(description="The links measured (empty unless asked).")


class ClustersPublic(BaseModel):
    data: list[ClusterPublic]
    count: int
