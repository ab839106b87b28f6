"""Profiles: upload (native JSON or PipeDream graph.txt), summaries, per-layer data."""

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from pipestudio.backend.schemas.common import Public, Request, choice, one_of
from pipestudio.planner import Profile
from pipestudio.planner.formats.documents import MAX_MICROBATCH_SIZE, Integral, Precision


class _ProfileSource(Request):
    name: str | None = Field(None, max_length=200, description="Default: the model name.")


class ProfileDocument(_ProfileSource):
    """The native Profile document (``format`` pipestudio, the default)."""

    format: Literal["pipestudio"] = "pipestudio"
    profile: Profile = Field(description="The Profile document.")


class PipeDreamGraph(_ProfileSource):
    """The text of a PipeDream graph.txt, converted on the way in."""

    format: Literal["pipedream"]
    graph: str = Field(min_length=1, description="PipeDream graph.txt text.")
    batch_size: Annotated[int, Field(ge=1, le=MAX_MICROBATCH_SIZE), Integral] = Field(
        description="The minibatch size the graph was profiled at (graph.txt does not say "
        "it, and every activation size and time scales with it)."
    )
    model: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="The model name (default: the profile's name).",
    )


AnyProfileCreate = ProfileDocument | PipeDreamGraph
ProfileCreate = one_of(
    (ProfileDocument, "pipestudio"),
    (PipeDreamGraph, "pipedream"),
    tag=choice("pipestudio", "pipedream", default="pipestudio"),
    what="format must be pipestudio (with profile) or pipedream (with graph)",
)


class ProfilePublic(Public):
    id: int
    name: str
    model: str
    num_layers: int
    microbatch_size: int
    precision: Precision = Field(description="The arithmetic the profile was measured in.")
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
