"""Profiles: upload (native JSON or PipeDream graph.txt), summaries, per-layer data."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import Public


class ProfileCreate(BaseModel):
    """A profile as JSON: the native document, or the text of a PipeDream graph.txt."""

    name: str | None = Field(None, max_length=200, description="Default: the model name.")
    format: Literal["pipestudio", "pipedream"] = "pipestudio"
    profile: dict[str, Any] | None = Field(None, description="The Profile document.")
    graph: str | None = Field(None, description="PipeDream graph.txt text (format pipedream).")
    batch_size: int = Field(1, ge=1, description="PipeDream: the profiled minibatch size.")
    model: str | None = Field(None, max_length=200, description="PipeDream: the model name.")


class ProfilePublic(Public):
    id: int
    name: str
    model: str
    num_layers: int
    microbatch_size: int
    source: str
    created_at: datetime


class ProfileDetailPublic(ProfilePublic):
    document: dict[str, Any]


class ProfilesPublic(BaseModel):
    data: list[ProfilePublic]
    count: int


class ProfileLayersPublic(BaseModel):
    """One array per field, in layer order (ready for charts)."""

    profile_id: int
    microbatch_size: int
    name: list[str]
    kind: list[str]
    fwd_ms: list[float]
    bwd_ms: list[float]
    update_ms: list[float]
    param_bytes: list[int]
    saved_bytes: list[int]
    output_bytes: list[int]
    workspace_bytes: list[int]
