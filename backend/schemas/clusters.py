"""Clusters: hardware descriptions (the Cluster document)."""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import Public, Request
from pipestudio.planner import Cluster


class ClusterCreate(Request):
    name: str | None = Field(None, max_length=200, description="Default: the document's name.")
    cluster: Cluster = Field(description="The Cluster document.")


class ClusterPublic(Public):
    id: int
    name: str
    num_devices: int
    document: dict[str, Any]
    created_at: datetime


class ClustersPublic(BaseModel):
    data: list[ClusterPublic]
    count: int
