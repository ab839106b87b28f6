"""Clusters: hardware descriptions (the Cluster document)."""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import Public, Request
from pipestudio.backend.schemas.runs import WorkerId
from pipestudio.planner import Cluster
from pipestudio.planner.formats.documents import Gbps


class ClusterCreate(Request):
    name: str | None = Field(None, max_length=200, description="Default: the document's name.")
    cluster: Cluster = Field(description="The Cluster document.")


class ClusterFromWorkers(Request):
    """A cluster of the workers as they are registered: one device per slot, grouped by
    host; the links' bandwidths are given (null: free)."""

    name: str | None = Field(None, max_length=200, description="Default: '<N> hosts'.")
    worker_ids: list[WorkerId] | None = Field(
        None, max_length=10_000, description="Default: every online worker."
    )
    within_host_gbps: Gbps | None = Field(
        None, description="Between two devices of one host; null: free."
    )
    between_hosts_gbps: Gbps | None = Field(None, description="Between two hosts; null: free.")


class ClusterPublic(Public):
    id: int
    name: str
    num_devices: int
    document: dict[str, Any]
    created_at: datetime


class ClustersPublic(BaseModel):
    data: list[ClusterPublic]
    count: int
